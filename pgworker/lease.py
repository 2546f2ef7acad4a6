"""Leases shared between a claimer and its dispatcher.

Each claimer process owns a :class:`SlotTable` in shared memory: one slot per job it
holds (job id, fencing token, state, start and progress times, flags). The claimer
writes progress into it (``ctx.heartbeat()`` is a store to shared memory, no query);
the dispatcher reads every table and renews all live leases of the pod in one batched,
fenced statement per interval. Renewal therefore never depends on the handler's thread
or event loop getting time: a handler that holds the GIL in a C extension, or blocks
its event loop, cannot starve the renewals of other jobs.

The dispatcher writes back the verdicts: ``lost`` when a renewal updated zero rows (or
could not reach the database for a whole lease), ``cancel`` when an operator asked for
the job to stop. A claimer reads them through :class:`pgworker.JobContext`.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

# Slot states.
EMPTY = 0
CLAIMED = 1    # claimed, waiting in the claimer's batch
RUNNING = 2    # the handler runs
DONE = 3       # outcome decided, waiting for the batched write (the lease still matters)
FLUSHING = 4   # the outcome write is in flight (not renewed, never marked lost)
RELEASING = 5  # taken over by the dispatcher (claimer died or was stopped)

RENEW_ALIVE = 0
RENEW_PROGRESS = 1

LIVE_STATES = (CLAIMED, RUNNING, DONE)


class Slot(ctypes.Structure):
    _fields_ = [
        ("state", ctypes.c_int32),
        ("queue_index", ctypes.c_int32),
        ("job_id", ctypes.c_int64),
        ("token", ctypes.c_int64),
        ("claimed_at", ctypes.c_double),     # time.monotonic() (CLOCK_MONOTONIC, shared by processes)
        ("started_at", ctypes.c_double),
        ("progress_at", ctypes.c_double),
        ("hard_limit", ctypes.c_double),     # seconds after start before the attempt is stopped
        ("renew_policy", ctypes.c_int32),
        ("lost", ctypes.c_int32),
        ("cancel", ctypes.c_int32),
        ("attempt", ctypes.c_int32),
        ("task_index", ctypes.c_int32),      # into the sorted task names; -1 when unknown
    ]


class Header(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_int64),
        ("loop_at", ctypes.c_double),        # last claimer loop iteration (monotonic)
        ("idle", ctypes.c_int32),            # waiting for a wake-up
        ("drained", ctypes.c_int32),         # last claim round found nothing due (drain mode)
        ("stopping", ctypes.c_int32),        # asked to stop claiming
        ("jobs_done", ctypes.c_int64),
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


@dataclass(frozen=True)
class SlotView:
    """A copy of one slot, taken under the lock."""

    index: int
    state: int
    queue_index: int
    job_id: int
    token: int
    claimed_at: float
    started_at: float
    progress_at: float
    hard_limit: float
    renew_policy: int
    attempt: int
    task_index: int
    lost: bool = False


LOCK_TIMEOUT_SECONDS = 2.0


class SlotTableBusy(Exception):
    """The slot table's lock stayed taken for LOCK_TIMEOUT_SECONDS: its claimer is
    stopped (SIGSTOP) or died while holding it."""


class WakeUp:
    """A wake-up flag between the dispatcher and one claimer that survives ``kill -9``.

    ``multiprocessing.Event`` does not: its Condition makes ``set()`` wait until every
    sleeper acknowledges, so a claimer killed while it waited left the dispatcher's next
    ``set()`` blocked forever (the chaos soak found it; see
    ``tests/acceptance/test_faults.py``). A semaphore capped at 1 needs no
    acknowledgement: ``set()`` never blocks, a dead waiter changes nothing.
    """

    def __init__(self, ctx: Any) -> None:
        self._sem = ctx.BoundedSemaphore(1)
        self._sem.acquire()  # start unset

    def set(self) -> None:
        try:
            self._sem.release()
        except ValueError:  # already set: one pending wake-up is enough
            pass

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True (and the flag consumed) if it was set."""
        return self._sem.acquire(timeout=timeout)

    def clear(self) -> None:
        while self._sem.acquire(False):
            pass


class SlotTable:
    """Fixed-size table of lease slots in shared memory, guarded by one lock.

    Created by the dispatcher and passed to the claimer process at spawn. All methods
    hold the lock for a few microseconds and never do I/O under it.
    """

    def __init__(self, capacity: int, ctx: Any | None = None) -> None:
        ctx = ctx or multiprocessing.get_context("spawn")
        self.capacity = capacity
        self.lock = ctx.Lock()
        self.slots = ctx.RawArray(Slot, capacity)
        self.header = ctx.RawValue(Header)
        self.wake = WakeUp(ctx)

    # -- claimer side ---------------------------------------------------------------

    def free_count(self) -> int:
        with self.lock:
            return sum(1 for s in self.slots if s.state == EMPTY)

    def put(self, job_id: int, token: int, queue_index: int, attempt: int, hard_limit: float,
            renew_policy: int, task_index: int = -1) -> int:
        """Record a freshly claimed job; returns its slot index."""
        return self.put_many([(job_id, token, queue_index, attempt, hard_limit, renew_policy, task_index)])[0]

    def put_many(self, entries: Sequence[tuple[int, int, int, int, float, int, int]]) -> list[int]:
        """Record a claim's jobs in one pass under one lock; returns their slot indexes.

        Each entry is (job id, token, queue index, attempt, hard limit, renew policy,
        task index). Raises RuntimeError when the table has fewer free slots than entries
        (nothing is recorded then).
        """
        now = time.monotonic()
        out: list[int] = []
        slots = self.slots
        with self.lock:
            free = [i for i in range(self.capacity) if slots[i].state == EMPTY][:len(entries)]
            if len(free) < len(entries):
                raise RuntimeError("slot table full: a claim took more jobs than the claimer has room for")
            for i, (job_id, token, queue_index, attempt, hard_limit, renew_policy, task_index) in zip(free, entries):
                s = slots[i]
                s.state, s.queue_index, s.job_id, s.token = CLAIMED, queue_index, job_id, token
                s.claimed_at = s.started_at = s.progress_at = now
                s.hard_limit, s.renew_policy = hard_limit, renew_policy
                s.lost = s.cancel = 0
                s.attempt, s.task_index = attempt, task_index
                out.append(i)
        return out

    def start(self, index: int, job_id: int) -> bool:
        """CLAIMED -> RUNNING; False if the dispatcher took the slot back meanwhile."""
        with self.lock:
            s = self.slots[index]
            if s.job_id != job_id or s.state != CLAIMED or s.lost:
                return False
            s.state = RUNNING
            s.started_at = s.progress_at = time.monotonic()
            return True

    def set_state(self, index: int, job_id: int, state: int) -> None:
        self.set_state_many(((index, job_id),), state)

    def set_state_many(self, slots: Iterable[tuple[int, int]], state: int) -> None:
        """Move each (slot index, job id) to ``state`` unless the slot changed hands or
        the dispatcher took it back (RELEASING)."""
        table = self.slots
        with self.lock:
            for index, job_id in slots:
                s = table[index]
                if s.job_id == job_id and s.state != RELEASING:
                    s.state = state

    def clear(self, index: int, job_id: int) -> None:
        self.clear_many(((index, job_id),))

    def clear_many(self, slots: Iterable[tuple[int, int]]) -> None:
        """Empty each (slot index, job id) that still holds that job."""
        table = self.slots
        with self.lock:
            for index, job_id in slots:
                s = table[index]
                if s.job_id == job_id:
                    s.state = EMPTY
                    s.job_id = s.token = 0

    def progress(self, index: int, job_id: int) -> None:
        s = self.slots[index]
        if s.job_id == job_id:  # a single aligned 8-byte store; no lock needed
            s.progress_at = time.monotonic()

    def flags(self, index: int, job_id: int) -> tuple[bool, bool]:
        """(lease lost, cancellation requested) for the job in this slot."""
        s = self.slots[index]
        if s.job_id != job_id:
            return True, False
        return bool(s.lost), bool(s.cancel)

    def beat(self, *, idle: bool | None = None) -> None:
        self.header.loop_at = time.monotonic()
        if idle is not None:
            self.header.idle = 1 if idle else 0

    def count(self, outcome: str, n: int = 1) -> None:
        setattr(self.header, outcome, getattr(self.header, outcome) + n)

    # -- dispatcher side ------------------------------------------------------------
    # The dispatcher never waits for the lock without a bound: a claimer stopped with
    # SIGSTOP, or killed with kill -9, while it held the lock (a few microseconds) would
    # otherwise stall every dispatcher thread, or all of them forever.

    @contextlib.contextmanager
    def _dispatcher_lock(self) -> Iterator[None]:
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_SECONDS):
            raise SlotTableBusy(f"slot table lock not free within {LOCK_TIMEOUT_SECONDS} s")
        try:
            yield
        finally:
            self.lock.release()

    def replace_lock(self, ctx: Any) -> None:
        """Give the table a fresh lock after its claimer died holding the old one (the
        only other holder, so the old lock can never be released). The replacement
        claimer receives the new lock at spawn."""
        self.lock = ctx.Lock()


    def live(self) -> list[SlotView]:
        """Copies of the slots holding a lease (claimed, running, or waiting to be written)."""
        with self._dispatcher_lock():
            return [self._view(i, s) for i, s in enumerate(self.slots) if s.state in LIVE_STATES]

    def held(self) -> list[SlotView]:
        """Every slot that is not empty (for a claimer that died: what it held)."""
        with self._dispatcher_lock():
            return [self._view(i, s) for i, s in enumerate(self.slots) if s.state != EMPTY]

    def mark(self, index: int, job_id: int, token: int, *, lost: bool = False, cancel: bool = False) -> bool:
        """Set the lost / cancel flag if the slot still holds this lease."""
        with self._dispatcher_lock():
            s = self.slots[index]
            if s.job_id != job_id or s.token != token or s.state in (EMPTY, FLUSHING):
                return False
            if lost:
                s.lost = 1
            if cancel:
                s.cancel = 1
            return True

    def take_back(self, index: int, job_id: int, token: int, states: tuple[int, ...]) -> bool:
        """Take a slot over for a release (the claimer will skip it); True if taken."""
        with self._dispatcher_lock():
            s = self.slots[index]
            if s.job_id == job_id and s.token == token and s.state in states:
                s.state = RELEASING
                return True
            return False

    def reset(self) -> dict[str, int]:
        """Empty every slot and zero the header (before a replacement claimer starts);
        returns the outcome counts the old claimer recorded."""
        with self._dispatcher_lock():
            counts = {f: getattr(self.header, f) for f in OUTCOME_FIELDS}
            ctypes.memset(ctypes.addressof(self.slots), 0, ctypes.sizeof(self.slots))
            ctypes.memset(ctypes.addressof(self.header), 0, ctypes.sizeof(self.header))
            return counts

    def outcome_counts(self) -> dict[str, int]:
        return {f: getattr(self.header, f) for f in OUTCOME_FIELDS}

    @staticmethod
    def _view(i: int, s: Slot) -> SlotView:
        return SlotView(i, s.state, s.queue_index, s.job_id, s.token, s.claimed_at, s.started_at,
                        s.progress_at, s.hard_limit, s.renew_policy, s.attempt, s.task_index, bool(s.lost))

    def __iter__(self) -> Iterator[Slot]:
        return iter(self.slots)


def process_stopped(pid: int) -> bool:
    """True when the process is stopped (SIGSTOP) or a zombie: alive but not working.

    Reads the state letter of /proc/<pid>/stat (Linux, proc(5)); elsewhere returns False.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    state = data[data.rfind(b")") + 2:][:1]
    return state in (b"T", b"t", b"Z")
