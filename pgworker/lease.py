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
import os
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


LOCK_TIMEOUT_SECONDS = 1.0


class SlotTable:
    """Fixed-size table of lease slots in shared memory, guarded by one lock.

    Created by the dispatcher and passed to the claimer process at spawn. Every method
    holds the lock for a few microseconds and never does I/O under it.

    Built to survive ``kill -9`` of either side: the lock is taken with a timeout (its
    holder may have died holding it; then the other side goes on without it, which is
    safe because the holder is dead or stopped) and is replaced, with the wake-up pipe,
    before a replacement claimer starts. Wake-ups go through a pipe rather than a
    ``multiprocessing.Event``: a process killed while waiting on an Event leaves the
    Event's condition variable waiting for it forever, and the next ``set()`` hangs.
    """

    def __init__(self, capacity: int, ctx: Any | None = None) -> None:
        self._ctx = ctx or multiprocessing.get_context("spawn")
        self.capacity = capacity
        self.slots = self._ctx.RawArray(Slot, capacity)
        self.header = self._ctx.RawValue(Header)
        self._fresh_primitives()

    def _fresh_primitives(self) -> None:
        self.lock = self._ctx.Lock()
        self.wake_reader, self.wake_writer = self._ctx.Pipe(duplex=False)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_ctx", None)
        state.pop("wake_writer", None)  # the claimer only reads
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        got = self.lock.acquire(timeout=LOCK_TIMEOUT_SECONDS)
        try:
            yield
        finally:
            if got:
                self.lock.release()

    # -- wake-ups -------------------------------------------------------------------

    def wake(self) -> None:
        """Dispatcher: wake the claimer (never blocks; a full pipe already means 'wake')."""
        try:
            fd = self.wake_writer.fileno()
            os.set_blocking(fd, False)
            os.write(fd, b"\x01")
        except (BlockingIOError, BrokenPipeError, OSError):
            pass

    def wait_wake(self, timeout: float) -> bool:
        """Claimer: wait up to ``timeout`` seconds for a wake-up; True if one came."""
        if not self.wake_reader.poll(timeout):
            return False
        fd = self.wake_reader.fileno()
        os.set_blocking(fd, False)
        try:
            while os.read(fd, 4096):
                pass
        except (BlockingIOError, OSError):
            pass
        return True

    # -- claimer side ---------------------------------------------------------------

    def free_count(self) -> int:
        with self._locked():
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
        got = self.lock.acquire(timeout=LOCK_TIMEOUT_SECONDS)
        try:
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
        finally:
            if got:
                self.lock.release()
        return out

    # The per-job transitions below take the lock inline rather than through _locked():
    # the claimer makes a few of them per job, and a generator context manager costs
    # more than the work under the lock.

    def start(self, index: int, job_id: int) -> bool:
        """CLAIMED -> RUNNING; False if the dispatcher took the slot back meanwhile."""
        got = self.lock.acquire(timeout=LOCK_TIMEOUT_SECONDS)
        try:
            s = self.slots[index]
            if s.job_id != job_id or s.state != CLAIMED or s.lost:
                return False
            s.state = RUNNING
            s.started_at = s.progress_at = time.monotonic()
            return True
        finally:
            if got:
                self.lock.release()

    def set_state(self, index: int, job_id: int, state: int) -> None:
        self.set_state_many(((index, job_id),), state)

    def set_state_many(self, slots: Iterable[tuple[int, int]], state: int) -> None:
        """Move each (slot index, job id) to ``state`` unless the slot changed hands or
        the dispatcher took it back (RELEASING)."""
        table = self.slots
        got = self.lock.acquire(timeout=LOCK_TIMEOUT_SECONDS)
        try:
            for index, job_id in slots:
                s = table[index]
                if s.job_id == job_id and s.state != RELEASING:
                    s.state = state
        finally:
            if got:
                self.lock.release()

    def clear(self, index: int, job_id: int) -> None:
        self.clear_many(((index, job_id),))

    def clear_many(self, slots: Iterable[tuple[int, int]]) -> None:
        """Empty each (slot index, job id) that still holds that job."""
        table = self.slots
        got = self.lock.acquire(timeout=LOCK_TIMEOUT_SECONDS)
        try:
            for index, job_id in slots:
                s = table[index]
                if s.job_id == job_id:
                    s.state = EMPTY
                    s.job_id = s.token = 0
        finally:
            if got:
                self.lock.release()

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

    def live(self) -> list[SlotView]:
        """Copies of the slots holding a lease (claimed, running, or waiting to be written)."""
        with self._locked():
            return [self._view(i, s) for i, s in enumerate(self.slots) if s.state in LIVE_STATES]

    def held(self) -> list[SlotView]:
        """Every slot that is not empty (for a claimer that died: what it held)."""
        with self._locked():
            return [self._view(i, s) for i, s in enumerate(self.slots) if s.state != EMPTY]

    def mark(self, index: int, job_id: int, token: int, *, lost: bool = False, cancel: bool = False) -> bool:
        """Set the lost / cancel flag if the slot still holds this lease."""
        with self._locked():
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
        with self._locked():
            s = self.slots[index]
            if s.job_id == job_id and s.token == token and s.state in states:
                s.state = RELEASING
                return True
            return False

    def reset(self) -> dict[str, int]:
        """Empty every slot, zero the header and replace the lock and the wake-up pipe
        (the old claimer may have died holding the lock); returns the outcome counts the
        old claimer recorded. Call it only once the old claimer is gone."""
        counts = {f: getattr(self.header, f) for f in OUTCOME_FIELDS}
        ctypes.memset(ctypes.addressof(self.slots), 0, ctypes.sizeof(self.slots))
        ctypes.memset(ctypes.addressof(self.header), 0, ctypes.sizeof(self.header))
        for conn in (self.wake_reader, self.wake_writer):
            with contextlib.suppress(OSError):
                conn.close()
        self._fresh_primitives()
        return counts

    def outcome_counts(self) -> dict[str, int]:
        return {f: getattr(self.header, f) for f in OUTCOME_FIELDS}

    @staticmethod
    def _view(i: int, s: Slot) -> SlotView:
        return SlotView(i, s.state, s.queue_index, s.job_id, s.token, s.claimed_at, s.started_at,
                        s.progress_at, s.hard_limit, s.renew_policy, s.attempt, s.task_index)

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
