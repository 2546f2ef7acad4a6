"""The slot table: the jobs one claimer process holds, in memory shared with the supervisor.

Each claimer owns one :class:`SlotTable`: one slot per job it holds, with the job's id,
fencing token, state, clocks, the supervisor's verdicts (``lost``, ``cancel``) and, once
the handler has finished, the decided outcome. ``ctx.heartbeat()`` is a store into it
(no query). The supervisor process reads every table: the renewer renews the live leases
of the whole pod in one statement, the lease clock presumes leases lost on its own
timer, and a claimer that dies leaves in its table everything needed to settle its jobs
(released if never started, failed ``WORKER_DIED`` if its handler was running, written
as decided if the outcome was already known). The rules that read these fields are the
lease contract, :mod:`pgworker.worker.lease`.

A slot moves through::

    EMPTY -> CLAIMED -> RUNNING -> DECIDED -> WRITING -> EMPTY
                \\-> STOLEN -> EMPTY   (an idle claimer of the pod took it over, see take_unstarted,
                                      or the supervisor took it back to release it, see take_waiting)

Locking: one :class:`~pgworker.worker.podlock.PodLock` per table, held for a few
microseconds and never across I/O; a process killed while holding it (the claimer, the
supervisor, or a peer inside this table) releases it as it dies. The claimer waits for
its own lock; anyone else (the supervisor, a peer taking over a job) waits at most
``LOCK_TIMEOUT_SECONDS`` and gets :class:`SlotTableBusy`, since a claimer stopped
(SIGSTOP) while holding it would otherwise stall them.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, NamedTuple, Sequence

from .podlock import PodLock
from .wakeups import WakeUp

# Slot states.
EMPTY = 0
CLAIMED = 1    # claimed, waiting in the claimer's batch (its clocks have not started)
RUNNING = 2    # the handler runs
DECIDED = 3    # outcome decided and recorded in the slot, waiting for the batched write
WRITING = 4    # the outcome write is in flight (renewed: a split write may outlast a lease; never marked lost)
STOLEN = 5     # another claimer of the pod is taking it over (moved_to); it renews and settles it
#: ``moved_to`` of a job the supervisor took back to release it (it waited too long, or the pod stops)
SUPERVISOR = -2

LIVE_STATES = (CLAIMED, RUNNING, DECIDED, WRITING, STOLEN)

# What SlotTable.start answers.
NOT_STARTABLE, STARTED, CANCEL_REQUESTED = 0, 1, 2
STATE_NAMES = {EMPTY: "empty", CLAIMED: "claimed", RUNNING: "running", DECIDED: "decided",
               WRITING: "writing", STOLEN: "stolen"}

RENEW_ALIVE = 0
RENEW_PROGRESS = 1

CODE_BYTES = 64
MESSAGE_BYTES = 512
LOCK_TIMEOUT_SECONDS = 2.0


class Slot(ctypes.Structure):
    _fields_ = [
        ("state", ctypes.c_int32),
        ("queue_index", ctypes.c_int32),
        ("job_id", ctypes.c_int64),
        ("token", ctypes.c_int64),
        ("order", ctypes.c_int64),           # claim order in this table: a batch runs in this order
        # time.monotonic() (CLOCK_MONOTONIC, shared by the pod's processes)
        ("claimed_at", ctypes.c_double),     # when the claim statement was sent
        ("renewed_at", ctypes.c_double),     # when the last accepted renewal was sent (0: none yet)
        ("started_at", ctypes.c_double),     # when the handler started (0: not yet)
        ("progress_at", ctypes.c_double),    # last ctx.heartbeat() (or the start)
        ("expires_at", ctypes.c_double),     # the lease's expiry by the database clock (Unix seconds)
        ("hard_limit", ctypes.c_double),     # seconds after the start before the attempt is stopped
        ("renew_policy", ctypes.c_int32),
        ("lost", ctypes.c_int32),
        ("cancel", ctypes.c_int32),
        ("attempt", ctypes.c_int32),
        ("task_index", ctypes.c_int32),      # into the sorted task names; -1 when unknown
        ("moved_to", ctypes.c_int32),        # STOLEN: index of the claimer taking it over
        # the decided outcome (DECIDED, WRITING): see pgworker.worker.outcome
        ("outcome", ctypes.c_int32),
        ("permanent", ctypes.c_int32),
        ("delay", ctypes.c_double),
        ("code", ctypes.c_char * CODE_BYTES),
        ("message", ctypes.c_char * MESSAGE_BYTES),
    ]


class Header(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_int64),
        ("loop_at", ctypes.c_double),        # last claimer loop iteration (monotonic)
        ("idle", ctypes.c_int32),            # waiting for a wake-up
        ("drained", ctypes.c_int32),         # last claim round found nothing due (drain mode)
        ("stopping", ctypes.c_int32),        # asked to stop claiming
        ("hint_queue", ctypes.c_int32),      # the queue whose work woke it (-1: none)
        ("order_seq", ctypes.c_int64),
        ("jobs_done", ctypes.c_int64),
        ("write_failing_since", ctypes.c_double),  # monotonic start of a run of failed outcome writes (0: ok)
        ("write_failure", ctypes.c_char * 200),    # why the last outcome write failed
        # outcome counts, for the drain summary
        ("succeeded", ctypes.c_int64),
        ("retried", ctypes.c_int64),
        ("dead", ctypes.c_int64),
        ("cancelled", ctypes.c_int64),
        ("released", ctypes.c_int64),
        ("snoozed", ctypes.c_int64),
        ("lost", ctypes.c_int64),
    ]


OUTCOME_FIELDS = ("succeeded", "retried", "dead", "cancelled", "released", "snoozed", "lost")


class SlotEntry(NamedTuple):
    """A freshly claimed job, as :meth:`SlotTable.put_many` records it."""

    job_id: int
    token: int
    queue_index: int
    attempt: int
    hard_limit: float
    renew_policy: int
    task_index: int = -1
    expires_at: float = 0.0


@dataclass(frozen=True)
class SlotView:
    """A copy of one slot, taken under the lock."""

    index: int
    state: int
    queue_index: int
    job_id: int
    token: int
    order: int
    claimed_at: float
    renewed_at: float
    started_at: float
    progress_at: float
    expires_at: float
    hard_limit: float
    renew_policy: int
    attempt: int
    task_index: int
    moved_to: int
    lost: bool
    outcome: int
    permanent: bool
    delay: float
    code: str
    message: str


class SlotTableBusy(Exception):
    """The slot table's lock stayed taken for LOCK_TIMEOUT_SECONDS: its claimer is
    stopped (SIGSTOP) or died while holding it."""


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _bytes(text: str, limit: int) -> bytes:
    """UTF-8 of ``text`` cut to fit ``limit`` bytes with its NUL, at a character boundary."""
    data = text.encode("utf-8", "replace")
    if len(data) < limit:
        return data
    return data[:limit - 1].decode("utf-8", "ignore").encode("utf-8")


class SlotTable:
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

    def put(self, job_id: int, token: int, queue_index: int, attempt: int, hard_limit: float,
            renew_policy: int, task_index: int = -1) -> int:
        """Record one freshly claimed job; returns its slot index."""
        return self.put_many([SlotEntry(job_id, token, queue_index, attempt, hard_limit, renew_policy,
                                        task_index)], claimed_at=time.monotonic())[0]

    def put_many(self, entries: Sequence[SlotEntry], *, claimed_at: float,
                 state: int = CLAIMED) -> list[int]:
        """Record a claim's jobs in one pass under one lock, in claim order; returns their
        slot indexes. ``claimed_at`` is when the claim statement was sent (monotonic).
        Raises RuntimeError when the table has fewer free slots than entries (nothing is
        recorded then)."""
        out: list[int] = []
        slots = self.slots
        with self.lock:
            free = [i for i in range(self.capacity) if slots[i].state == EMPTY][:len(entries)]
            if len(free) < len(entries):
                raise RuntimeError("slot table full: a claim took more jobs than the claimer has room for")
            seq = self.header.order_seq
            for i, e in zip(free, entries):
                s = slots[i]
                seq += 1
                s.state, s.queue_index, s.job_id, s.token, s.order = state, e.queue_index, e.job_id, e.token, seq
                s.claimed_at, s.renewed_at, s.started_at, s.progress_at = claimed_at, 0.0, 0.0, 0.0
                s.expires_at, s.hard_limit, s.renew_policy = e.expires_at, e.hard_limit, e.renew_policy
                s.lost = s.cancel = s.outcome = s.permanent = 0
                s.attempt, s.task_index, s.moved_to, s.delay = e.attempt, e.task_index, -1, 0.0
                s.code = s.message = b""
                out.append(i)
            self.header.order_seq = seq
        return out

    def start(self, index: int, job_id: int) -> int:
        """CLAIMED -> RUNNING, starting the job's runtime and progress clocks. Returns
        STARTED; CANCEL_REQUESTED when an operator cancelled the job while it waited (it
        is not started); or NOT_STARTABLE when the slot no longer holds a startable job (a
        peer took it over, or its lease was found lost while it waited: never start work
        whose lease may be gone)."""
        with self.lock:
            s = self.slots[index]
            if s.job_id != job_id or s.state != CLAIMED or s.lost:
                return NOT_STARTABLE
            if s.cancel:
                return CANCEL_REQUESTED
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
                s.code, s.message = _bytes(code, CODE_BYTES), _bytes(message, MESSAGE_BYTES)
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

    def set_state(self, index: int, job_id: int, state: int) -> None:
        self.set_state_many(((index, job_id),), state)

    def clear_many(self, slots: Iterable[tuple[int, int]]) -> None:
        """Empty each (slot index, job id) that still holds that job."""
        table = self.slots
        with self.lock:
            for index, job_id in slots:
                s = table[index]
                if s.job_id == job_id:
                    s.state = EMPTY
                    s.job_id = s.token = 0

    def clear(self, index: int, job_id: int) -> None:
        self.clear_many(((index, job_id),))

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

    def beat(self, *, idle: bool | None = None) -> None:
        self.header.loop_at = time.monotonic()
        if idle is not None:
            self.header.idle = 1 if idle else 0

    def count(self, outcome: str, n: int = 1) -> None:
        with self.lock:  # the claimer's main and flusher threads both account their flushes
            setattr(self.header, outcome, getattr(self.header, outcome) + n)

    def write_health(self, failure: str | None) -> None:
        """Record whether outcome writes succeed (None) or fail, and why: the supervisor's
        /readyz names a claimer that cannot write outcomes."""
        h = self.header
        if failure is None:
            h.write_failing_since = 0.0
        else:
            if not h.write_failing_since:
                h.write_failing_since = time.monotonic()
            h.write_failure = _bytes(failure, 200)

    # -- a peer claimer of the pod ----------------------------------------------------

    def take_unstarted(self, thief: int) -> SlotView | None:
        """Take over the next job that waits unstarted in this table (CLAIMED -> STOLEN):
        an idle claimer of the pod runs it instead of letting it wait behind the owner's
        current job. Returns the slot as it was, or None when nothing waits. Raises
        :class:`SlotTableBusy` when the owner holds the lock too long."""
        with self._bounded_lock():
            waiting = [(s.order, i) for i, s in enumerate(self.slots) if s.state == CLAIMED and not s.lost]
            if not waiting:
                return None
            _, i = min(waiting)
            s = self.slots[i]
            s.state, s.moved_to = STOLEN, thief
            return self._view(i, s)

    def take_waiting(self, claimed_before: float) -> list[SlotView]:
        """The supervisor's side of a take-over: every job that waits unstarted and was
        claimed before ``claimed_before`` (monotonic), CLAIMED -> STOLEN (``moved_to`` =
        :data:`SUPERVISOR`), to be handed back to the table (released, no attempt spent)
        and emptied with :meth:`finish_move`. Raises :class:`SlotTableBusy`."""
        with self._bounded_lock():
            out = []
            for i, s in enumerate(self.slots):
                if s.state == CLAIMED and not s.lost and s.claimed_at < claimed_before:
                    s.state, s.moved_to = STOLEN, SUPERVISOR
                    out.append(self._view(i, s))
            return out

    def finish_move(self, index: int, job_id: int, token: int) -> tuple[bool, bool]:
        """The job taken over with :meth:`take_unstarted` now lives in the peer's table (or
        was found lost): empty its old slot here. Returns its (lost, cancel) flags, set here
        until then, for the taker's slot (a cancelled job is never started, nor a lost one)."""
        with self._bounded_lock():
            s = self.slots[index]
            if s.job_id == job_id and s.token == token and s.state == STOLEN:
                flags = bool(s.lost), bool(s.cancel)
                s.state = EMPTY
                s.job_id = s.token = 0
                return flags
            return False, False

    def give_back(self, index: int, job_id: int, token: int) -> None:
        """Undo :meth:`take_unstarted` (the peer could not reach the database): STOLEN ->
        CLAIMED, for its owner to run."""
        with self._bounded_lock():
            s = self.slots[index]
            if s.job_id == job_id and s.token == token and s.state == STOLEN:
                s.state, s.moved_to = CLAIMED, -1

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
            return [self._view(i, s) for i, s in enumerate(self.slots) if s.state in LIVE_STATES]

    def held(self) -> list[SlotView]:
        """Every slot that is not empty (for a claimer that died: what it held)."""
        with self._bounded_lock():
            return [self._view(i, s) for i, s in enumerate(self.slots) if s.state != EMPTY]

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

    def clear_slots(self, views: Iterable[SlotView]) -> None:
        """Empty these slots if they still hold the same lease (their jobs were settled)."""
        with self._bounded_lock():
            for v in views:
                s = self.slots[v.index]
                if s.job_id == v.job_id and s.token == v.token:
                    s.state = EMPTY
                    s.job_id = s.token = 0

    def reset(self) -> dict[str, int]:
        """Empty every slot and zero the header (before a replacement claimer starts);
        returns the outcome counts the old claimer recorded."""
        with self._bounded_lock():
            counts = self.outcome_counts()
            ctypes.memset(ctypes.addressof(self.slots), 0, ctypes.sizeof(self.slots))
            ctypes.memset(ctypes.addressof(self.header), 0, ctypes.sizeof(self.header))
            self.header.hint_queue = -1
            return counts

    def outcome_counts(self) -> dict[str, int]:
        return {f: getattr(self.header, f) for f in OUTCOME_FIELDS}

    @staticmethod
    def _view(i: int, s: Slot) -> SlotView:
        return SlotView(i, s.state, s.queue_index, s.job_id, s.token, s.order, s.claimed_at, s.renewed_at,
                        s.started_at, s.progress_at, s.expires_at, s.hard_limit, s.renew_policy, s.attempt,
                        s.task_index, s.moved_to, bool(s.lost), s.outcome, bool(s.permanent), s.delay,
                        _text(s.code), _text(s.message))
