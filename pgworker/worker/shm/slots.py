"""The slot table: the jobs one claimer process holds, in memory shared with the supervisor.

Each claimer owns one :class:`SlotTable`: one slot per job it holds, with the job's id,
fencing token, state, clocks, the supervisor's verdicts (``lost``, ``cancel``) and, once
the handler has finished, the decided outcome. ``ctx.heartbeat()`` is a store into it
(no query). The supervisor process reads every table: the renewer renews the live leases
of the whole pod in one statement, the lease clock presumes leases lost on its own
timer, and a claimer that dies leaves in its table everything needed to settle its jobs
(released if never started, failed ``WORKER_DIED`` if its handler was running, written
as decided if the outcome was already known). The rules that read these fields are the
lease contract, :mod:`pgworker.worker.lease`; the layout and the states are
:mod:`.layout`, the header's fields :mod:`.header`.

Locking: one :class:`~.lock.PodLock` per table, held for a few microseconds and never
across I/O; a process killed while holding it (the claimer, the supervisor, or a peer
inside this table) releases it as it dies. The claimer waits for its own lock; anyone
else (the supervisor, a peer taking over a job) waits at most ``LOCK_TIMEOUT_SECONDS``
and gets :class:`SlotTableBusy`, since a claimer stopped (SIGSTOP) while holding it
would otherwise stall them.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import time
from typing import Any, Iterable, Iterator, Sequence

from .header import HeaderAccess
from .layout import (CANCEL_REQUESTED, CLAIMED, CLAIMED_SLOT, CODE_BYTES, DECIDED, EMPTY, HANDED_BACK, LEASE_EXPIRED, LIVE_STATES,
                     MESSAGE_BYTES, MOVING, NOT_STARTABLE, RUNNING, SLOT_BYTES, STARTED, SUPERVISOR, WRITING, Header, Slot,
                     SlotEntry, SlotView, fit, view)
from .lock import PodLock
from .wakeups import WakeUp

LOCK_TIMEOUT_SECONDS = 2.0


class SlotTableBusy(Exception):
    """The slot table's lock stayed taken for LOCK_TIMEOUT_SECONDS: its claimer is
    stopped (SIGSTOP) or died while holding it."""


class SlotTable(HeaderAccess):
    """Fixed-size table of lease slots in shared memory, guarded by one lock.

    Created by the supervisor and passed to the claimer process at spawn (and to its
    peers, which may take over jobs that wait in it). Methods hold the lock for a few
    microseconds and never do I/O under it.
    """

    def __init__(self, capacity: int, ctx: Any | None = None) -> None:
        ctx = ctx or multiprocessing.get_context("spawn")
        self.capacity = capacity
        self.lock = PodLock("pgworker-slots-")
        self.slots = ctx.RawArray(Slot, capacity)
        self.header = ctx.RawValue(Header)
        self.header.hint_queue = -1
        self.wake = WakeUp(ctx)

    # -- the claimer's side ---------------------------------------------------------

    def free_count(self) -> int:
        with self.lock:
            return sum(1 for s in self.slots if s.state == EMPTY)

    def put_many(self, entries: Sequence[SlotEntry], *, claimed_at: float,
                 state: int = CLAIMED) -> list[int]:
        """Record a claim's jobs in one pass under one lock, in claim order; returns their
        slot indexes. ``claimed_at`` is when the claim statement was sent (monotonic).
        Raises RuntimeError when the table has fewer free slots than entries (nothing is
        recorded then)."""
        slots, pack = self.slots, CLAIMED_SLOT.pack_into
        with self.lock:
            free = [i for i in range(self.capacity) if slots[i].state == EMPTY][:len(entries)]
            if len(free) < len(entries):
                raise RuntimeError("slot table full: a claim took more jobs than the claimer has room for")
            seq = self.header.order_seq
            for i, e in zip(free, entries):
                seq += 1
                # state, queue, job, token, order; claimed, renewed, started, progress, expires, hard
                # limit; renew policy, lost, cancel, attempt, task, moved to, outcome, permanent;
                # delay; code and message emptied
                pack(slots, i * SLOT_BYTES, state, e.queue_index, e.job_id, e.token, seq,
                     claimed_at, 0.0, 0.0, 0.0, e.expires_at, e.hard_limit,
                     e.renew_policy, 0, 0, e.attempt, e.task_index, -1, 0, 0,
                     0.0, 0, 0)
            self.header.order_seq = seq
        return free

    def start(self, index: int, job_id: int, renewed_after: float = 0.0) -> int:
        """CLAIMED -> RUNNING, starting the job's runtime and progress clocks. Returns
        STARTED; CANCEL_REQUESTED when an operator cancelled the job while it waited (it
        is not started); NOT_STARTABLE when the slot no longer holds a startable job (a
        peer took it over, or its lease was found lost while it waited: never start work
        whose lease may be gone); or LEASE_EXPIRED when its last accepted renewal (or its
        claim) was sent at or before ``renewed_after`` (monotonic; the lease contract's
        ``start_cutoff``): the slot is then marked lost, and not started."""
        with self.lock:
            s = self.slots[index]
            if s.job_id != job_id or s.state != CLAIMED or s.lost:
                return NOT_STARTABLE
            if s.cancel:
                return CANCEL_REQUESTED
            if max(s.renewed_at, s.claimed_at) <= renewed_after:
                s.lost = 1
                return LEASE_EXPIRED
            s.state = RUNNING
            s.started_at = s.progress_at = time.monotonic()
            return STARTED

    def decide(self, index: int, job_id: int, outcome: int, *, delay: float = 0.0, permanent: bool = False,
               code: str = "", message: str = "") -> bool:
        """Record a decided outcome (CLAIMED or RUNNING -> DECIDED), so that the supervisor
        can write it as decided should this process die before the batched write."""
        with self.lock:
            s = self.slots[index]
            if s.job_id != job_id or s.state not in (CLAIMED, RUNNING):
                return False
            s.state, s.outcome, s.delay, s.permanent = DECIDED, outcome, delay, 1 if permanent else 0
            if code or message:
                s.code, s.message = fit(code, CODE_BYTES), fit(message, MESSAGE_BYTES)
            return True

    def mark_committed(self, index: int, job_id: int, outcome: int) -> bool:
        """Record that a running handler's own transaction committed its job's success
        (``outcome``: COMMITTED of pgworker.worker.outcome), the slot staying RUNNING while
        the handler finishes: the row has left 'running', so the lease is no longer renewed
        or presumed lost (pgworker.worker.lease), and a claimer that dies now is settled
        with no write (the settler)."""
        with self.lock:
            s = self.slots[index]
            if s.job_id != job_id or s.state != RUNNING:
                return False
            s.outcome = outcome
            return True

    def set_state_many(self, slots: Iterable[tuple[int, int]], state: int) -> None:
        """Move each (slot index, job id) that still holds that job to ``state``."""
        table = self.slots
        with self.lock:
            for index, job_id in slots:
                s = table[index]
                if s.job_id == job_id and s.state != EMPTY:
                    s.state = state

    def empty_jobs(self, slots: Iterable[tuple[int, int]]) -> None:
        """Empty each (slot index, job id) that still holds that job."""
        table = self.slots
        with self.lock:
            for index, job_id in slots:
                s = table[index]
                if s.job_id == job_id:
                    s.state = EMPTY
                    s.job_id = s.token = 0

    def empty_job(self, index: int, job_id: int) -> None:
        self.empty_jobs(((index, job_id),))

    def progress(self, index: int, job_id: int) -> None:
        s = self.slots[index]
        if s.job_id == job_id:  # a single aligned 8-byte store; no lock needed
            s.progress_at = time.monotonic()

    def flags(self, index: int, job_id: int) -> tuple[bool, bool]:
        """(lease lost, cancellation requested) for the job in this slot; a slot that no
        longer holds the job reads as lost."""
        s = self.slots[index]
        if s.job_id != job_id:
            return True, False
        return bool(s.lost), bool(s.cancel)

    def expiry(self, index: int, job_id: int) -> float:
        """The lease's expiry (Unix seconds, database clock) of the job in this slot, as the
        claim or the last accepted renewal set it; 0.0 when the slot holds another job."""
        s = self.slots[index]
        return s.expires_at if s.job_id == job_id else 0.0

    def state_of(self, index: int, job_id: int) -> int:
        """The slot's state if it still holds this job, else EMPTY."""
        s = self.slots[index]
        state = s.state
        return state if s.job_id == job_id else EMPTY

    def held_queues(self) -> list[int]:
        """The queue index of every non-empty slot (per-pod limits count them)."""
        with self.lock:
            return [s.queue_index for s in self.slots if s.state != EMPTY]

    # -- a peer claimer of the pod ----------------------------------------------------

    def take_over_next(self, taker: int) -> SlotView | None:
        """Take over the next job that waits unstarted in this table (CLAIMED -> MOVING):
        an idle claimer of the pod (index ``taker``) runs it instead of letting it wait
        behind the owner's current job. Returns the slot as it was, or None when nothing
        waits. Raises :class:`SlotTableBusy` when the owner holds the lock too long."""
        with self._bounded_lock():
            waiting = [(s.order, i) for i, s in enumerate(self.slots) if s.state == CLAIMED and not s.lost]
            if not waiting:
                return None
            _, i = min(waiting)
            s = self.slots[i]
            s.state, s.moved_to = MOVING, taker
            return view(i, s)

    def empty_moved(self, index: int, job_id: int, token: int) -> tuple[bool, bool]:
        """The job taken over with :meth:`take_over_next` now lives in the taker's table (or
        was found lost): empty its old slot here. Returns its (lost, cancel) flags, set here
        until then, for the taker's slot (a cancelled job is never started, nor a lost one)."""
        return self._end_transit(MOVING, index, job_id, token)

    def undo_take_over(self, index: int, job_id: int, token: int) -> None:
        """Undo :meth:`take_over_next` (the taker could not reach the database): MOVING ->
        CLAIMED, for its owner to run."""
        with self._bounded_lock():
            s = self.slots[index]
            if s.job_id == job_id and s.token == token and s.state == MOVING:
                s.state, s.moved_to = CLAIMED, -1

    def hand_back_waiting(self, claimed_before: float) -> list[SlotView]:
        """The supervisor's side of a take-over: every job that waits unstarted and was
        claimed before ``claimed_before`` (monotonic), CLAIMED -> HANDED_BACK (``moved_to``
        = :data:`SUPERVISOR`), to be released to the table (no attempt spent) and emptied
        with :meth:`empty_handed_back`. Raises :class:`SlotTableBusy`."""
        with self._bounded_lock():
            out = []
            for i, s in enumerate(self.slots):
                if s.state == CLAIMED and not s.lost and s.claimed_at < claimed_before:
                    s.state, s.moved_to = HANDED_BACK, SUPERVISOR
                    out.append(view(i, s))
            return out

    def empty_handed_back(self, index: int, job_id: int, token: int) -> None:
        """The job taken with :meth:`hand_back_waiting` was released: empty its slot."""
        self._end_transit(HANDED_BACK, index, job_id, token)

    def _end_transit(self, state: int, index: int, job_id: int, token: int) -> tuple[bool, bool]:
        with self._bounded_lock():
            s = self.slots[index]
            if s.job_id == job_id and s.token == token and s.state == state:
                flags = bool(s.lost), bool(s.cancel)
                s.state = EMPTY
                s.job_id = s.token = 0
                return flags
            return False, False

    # -- the supervisor's side ------------------------------------------------------

    @contextlib.contextmanager
    def _bounded_lock(self) -> Iterator[None]:
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_SECONDS):
            raise SlotTableBusy(f"slot table lock not free within {LOCK_TIMEOUT_SECONDS} s")
        try:
            yield
        finally:
            self.lock.release()

    def live(self) -> list[SlotView]:
        """Copies of the slots whose lease the pod keeps (every state but empty)."""
        with self._bounded_lock():
            return [view(i, s) for i, s in enumerate(self.slots) if s.state in LIVE_STATES]

    def held(self) -> list[SlotView]:
        """Every slot that is not empty (for a claimer that died: what it held)."""
        with self._bounded_lock():
            return [view(i, s) for i, s in enumerate(self.slots) if s.state != EMPTY]

    def mark(self, index: int, job_id: int, token: int, *, lost: bool = False, cancel: bool = False) -> bool:
        """Set the lost / cancel flag if the slot still holds this lease (an outcome write
        in flight is left alone: the fence decides it)."""
        with self._bounded_lock():
            s = self.slots[index]
            if s.job_id != job_id or s.token != token or s.state in (EMPTY, WRITING):
                return False
            if lost:
                s.lost = 1
            if cancel:
                s.cancel = 1
            return True

    def try_mark_lost(self, v: SlotView) -> bool:
        """Mark this lease lost (see :meth:`mark`); False when the slot no longer holds it,
        or when its claimer holds the lock too long (stopped): the lease clock and the
        renewer both try again on their next tick, so neither waits on a stopped claimer."""
        try:
            return self.mark(v.index, v.job_id, v.token, lost=True)
        except SlotTableBusy:
            return False

    def try_mark_cancel(self, index: int, job_id: int, token: int) -> bool:
        """Set the cancel flag as a renewal does (see :meth:`mark`), from the handler's own
        progress write that read the request; False when the slot no longer holds the lease
        or the lock stays taken (the supervisor stopped): the next renewal carries it then."""
        try:
            return self.mark(index, job_id, token, cancel=True)
        except SlotTableBusy:
            return False

    def renewed(self, renewals: Iterable[tuple[int, int, int, float, bool]], sent_at: float) -> None:
        """Record accepted renewals: (slot index, job id, token, new expiry in Unix seconds,
        cancellation requested), renewed by a statement sent at ``sent_at`` (monotonic)."""
        with self._bounded_lock():
            for index, job_id, token, expires_at, cancel in renewals:
                s = self.slots[index]
                if s.job_id == job_id and s.token == token and s.state != EMPTY:
                    s.renewed_at = max(s.renewed_at, sent_at)
                    s.expires_at = expires_at
                    if cancel:
                        s.cancel = 1

    def empty_settled(self, views: Iterable[SlotView]) -> None:
        """Empty these slots if they still hold the same lease (their jobs were settled)."""
        with self._bounded_lock():
            for v in views:
                s = self.slots[v.index]
                if s.job_id == v.job_id and s.token == v.token:
                    s.state = EMPTY
                    s.job_id = s.token = 0

    def reset_for_replacement(self) -> dict[str, int]:
        """Empty every slot and zero the header (before a replacement claimer starts);
        returns the outcome counts the old claimer recorded."""
        with self._bounded_lock():
            counts = self.outcome_counts()
            ctypes.memset(ctypes.addressof(self.slots), 0, ctypes.sizeof(self.slots))
            ctypes.memset(ctypes.addressof(self.header), 0, ctypes.sizeof(self.header))
            self.header.hint_queue = -1
            return counts
