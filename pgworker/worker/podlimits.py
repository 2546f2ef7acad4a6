"""Per-pod concurrency per queue: at most N jobs of a queue held by one pod's claimers.

``pgworker run --queue-concurrency emails=2`` caps the jobs of ``emails`` that the
claimers of this pod hold at once (claimed, running, or waiting for their outcome to be
written), whatever the number of claimer processes. (The global limit across pods is
the queue's ``concurrency_limit``, enforced by the claim in the database.)

The count lives in shared memory, one row per claimer process: a claimer writes only
its own row, so a dead claimer's share is dropped by zeroing its row (the supervisor
does this when it settles the dead claimer's jobs). A claimer reserves room before it
claims: under a pod-wide lock it sums the other rows and raises its own. The lock is an
``flock`` on a file, which the kernel releases when its holder dies, so a claimer killed
inside the critical section cannot wedge the pod (a ``multiprocessing.Lock`` would stay
held forever). Rows only grow under the lock; they shrink without it (a stale larger
value only makes the others more careful).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import tempfile
import threading
from typing import Any, Callable, Iterator

HeldCount = Callable[[str], int]


class PodQueueLimits:
    """Shared per-queue counts of one pod; created by the supervisor, passed to claimers."""

    def __init__(self, limits: dict[str, int], claimers: int, ctx: Any) -> None:
        self.queues = tuple(sorted(limits))
        self.caps = tuple(limits[q] for q in self.queues)
        self.claimers = claimers
        self.held = ctx.RawArray(ctypes.c_int64, max(1, claimers * len(self.queues)))
        fd, self.lock_path = tempfile.mkstemp(prefix="pgworker-podlimits-")
        os.close(fd)
        self._init_local()

    def _init_local(self) -> None:
        self._fd: int | None = None
        self._local = threading.Lock()  # the claimer's main and flusher threads
        self._outstanding = [0] * len(self.queues)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_fd", "_local", "_outstanding"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_local()

    def limits(self, queue: str) -> bool:
        return queue in self.queues

    @contextlib.contextmanager
    def _pod_lock(self) -> Iterator[None]:
        if self._fd is None:
            self._fd = os.open(self.lock_path, os.O_RDWR)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _write_own(self, claimer: int, held: HeldCount) -> None:
        base = claimer * len(self.queues)
        for qi, q in enumerate(self.queues):
            self.held[base + qi] = held(q) + self._outstanding[qi]

    def reserve(self, claimer: int, queue: str, want: int, held: HeldCount) -> int:
        """Room for up to ``want`` more jobs of ``queue`` for this claimer; returns the
        grant (0..want), counted as held until :meth:`claimed` reports what was taken.
        ``held(queue)`` counts the claimer's own slots of a queue."""
        if queue not in self.queues:
            return want
        qi = self.queues.index(queue)
        n_q = len(self.queues)
        with self._local, self._pod_lock():
            others = sum(self.held[c * n_q + qi] for c in range(self.claimers) if c != claimer)
            mine = held(queue) + self._outstanding[qi]
            grant = max(0, min(want, self.caps[qi] - others - mine))
            self._outstanding[qi] += grant
            self._write_own(claimer, held)
        return grant

    def claimed(self, claimer: int, queue: str, granted: int, held: HeldCount) -> None:
        """The claim for a grant returned (its jobs are now in the claimer's slots)."""
        if queue not in self.queues:
            return
        qi = self.queues.index(queue)
        with self._local:
            self._outstanding[qi] = max(0, self._outstanding[qi] - granted)
            self._write_own(claimer, held)

    def refresh(self, claimer: int, held: HeldCount) -> None:
        """Jobs were settled: shrink this claimer's row to what it holds."""
        with self._local:
            self._write_own(claimer, held)

    def release(self, claimer: int, queue: str, n: int = 1) -> None:
        """Supervisor: ``n`` jobs of ``queue`` left a live claimer's slots without it (the
        supervisor handed them back): shrink its row now, since a claimer stuck in a long
        handler does not rewrite it (its peers would otherwise find no room for the very
        jobs handed back)."""
        if queue not in self.queues:
            return
        i = claimer * len(self.queues) + self.queues.index(queue)
        self.held[i] = max(0, self.held[i] - n)

    def drop_claimer(self, claimer: int) -> None:
        """Supervisor: drop a dead (or replaced) claimer's share."""
        base = claimer * len(self.queues)
        for qi in range(len(self.queues)):
            self.held[base + qi] = 0

    def close(self) -> None:
        """Supervisor: remove the lock file."""
        with contextlib.suppress(OSError):
            os.unlink(self.lock_path)
