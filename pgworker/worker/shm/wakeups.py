"""Wake-ups inside a pod: work announced once starts one claim, by one idle claimer.

A NOTIFY for queue Q, the fallback poll, a LISTEN reconnect, and a claimer whose claim
came back full (more may be due) or holding several jobs (idle peers may take the
waiting ones) all *announce work*: :meth:`PodSignals.announce` bumps the pod's work
generation and wakes ONE idle claimer, telling it which queue to ask first. Busy
claimers need no wake-up: a claimer always claims again after it ran something. A claim
that holds several jobs wakes as many idle peers as jobs wait in it (each takes one
over). So an
idle fleet costs one claim round per pod per poll, and an enqueue one claim per pod,
whatever the number of claimers (before: every claimer of every pod, each time).

The lost wake-up (a claimer going idle just as work is announced, and no idle claimer
seen) is closed by the generation: a claimer reads it before its claim round, and on
its way to sleep, after raising its idle flag, reads it again; if it moved, it claims
again instead of sleeping. The announcer bumps the generation before it looks for idle
claimers. A fence between each side's store and load (a lock's acquire and release,
which are atomic read-modify-writes) keeps either side from reading a stale value, so
one of the two always sees the other. The generation only grows: it is bumped under a
pod-wide lock (:class:`~pgworker.worker.shm.lock.PodLock`, which a holder killed with it
cannot keep), since an unlocked ``+= 1`` from several processes could store back a value
a claimer had already seen, and that claimer then slept through the announcement.

Wake-ups remain hints: the table is the truth, and a lost wake-up costs at most one
poll interval.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Protocol, Sequence

from .lock import PodLock

_fence_lock = threading.Lock()


def fence() -> None:
    """A full memory barrier for this process's stores to shared memory (see the module)."""
    with _fence_lock:
        pass


class WakeUp:
    """A wake-up flag between the pod and one claimer that survives ``kill -9``.

    ``multiprocessing.Event`` does not: its Condition makes ``set()`` wait until every
    sleeper acknowledges, so a claimer killed while it waited left the next ``set()``
    blocked forever (the chaos soak found it; see ``tests/acceptance/test_faults.py``).
    A semaphore capped at 1 needs no acknowledgement: ``set()`` never blocks, a dead
    waiter changes nothing.
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


class Wakeable(Protocol):
    """What :meth:`PodSignals.announce` needs of a claimer's slot table: its header (the
    ``idle``, ``stopping`` and ``hint_queue`` fields) and its wake-up."""

    @property
    def header(self) -> Any: ...

    @property
    def wake(self) -> WakeUp: ...


class PodSignals:
    """The pod's work generation and the round-robin cursor of wake-ups, in shared memory.

    Created by the supervisor before the claimers, passed to each at spawn; the claimers'
    idle flags, hints and semaphores live in their slot tables' headers.
    """

    def __init__(self, ctx: Any) -> None:
        self._generation = ctx.RawValue(ctypes.c_int64)
        self._cursor = ctx.RawValue(ctypes.c_int64)
        self._lock = PodLock("pgworker-signals-")

    @property
    def generation(self) -> int:
        return self._generation.value

    def announce(self, tables: Sequence[Wakeable], queue_index: int = -1, *, exclude: int = -1,
                 count: int = 1) -> int:
        """Work is due (on ``queue_index``, or unknown: -1): wake up to ``count`` idle
        claimers, never ``exclude`` (the announcing claimer itself). Returns how many were
        woken; with none idle, the busy ones claim again when they finish, and any on its
        way to sleep sees the new generation."""
        self._bump()
        fence()
        n = len(tables)
        start = self._cursor.value
        woken = 0
        for k in range(n):
            if woken >= count:
                break
            i = (start + k) % n
            header = tables[i].header
            if i != exclude and header.idle and not header.stopping:
                self._cursor.value = i + 1
                header.hint_queue = queue_index
                header.idle = 0  # taken: the next announcement picks another idle claimer
                tables[i].wake.set()
                woken += 1
        return woken

    def _bump(self) -> None:
        with self._lock:  # a read-modify-write from several processes: never lose one
            self._generation.value += 1

    def close(self) -> None:
        """The supervisor: remove the lock's file."""
        self._lock.close()
