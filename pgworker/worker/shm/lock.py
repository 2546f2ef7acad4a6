"""A lock shared by the processes of a pod that a dead holder cannot keep.

A ``multiprocessing.Lock`` (a POSIX semaphore) taken by a process that is then killed
(kill -9, the OOM killer, a timeout) stays taken forever: every process that waits for it
waits forever, and one that waits with a timeout never gets it again. A slot table's lock
is taken by its claimer, by the supervisor, and by the pod's other claimers when they
take over a waiting job, so a claimer killed inside a peer's table once wedged that peer
for good, and a replacement lock never reached the peers, which kept the old one.

:class:`PodLock` is an ``flock`` on a file of its own (as the per-pod queue limits use,
:mod:`pgworker.worker.podlimits`): the kernel releases it when its holder dies, so the
next process gets it at once, and no lock is ever replaced. The threads of one process
share its file descriptor, which ``flock`` does not tell apart, so a thread lock orders
them first. The descriptor is opened per process (after a ``fork`` or in a ``spawn``ed
child, on first use); the file is removed by the process that created the lock, at
:meth:`close` or at its exit.

A claimer takes its table's lock twice a job (start, decide): the unbounded path is two
``flock`` calls and a thread lock, nothing more. A forked child forgets the parent's
descriptor and thread lock in an ``os.register_at_fork`` hook rather than by comparing
``os.getpid()`` on every call (a system call: three of them made a lock cycle 3 µs).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import tempfile
import threading
import time
import weakref
from typing import Any

# A bounded acquire polls (flock has no timeout): from this pause, doubling up to the cap.
# The lock is held for microseconds, so the first retry nearly always gets it.
POLL_FIRST_SECONDS = 0.0002
POLL_MAX_SECONDS = 0.005


# Every PodLock of this process, for the fork hook below.
_LOCKS: "weakref.WeakSet[PodLock]" = weakref.WeakSet()


def _forget_parents_locks() -> None:
    """In a forked child: the inherited descriptor shares the parent's flock (an flock
    belongs to the open file, which a fork shares), and a thread lock may have been held
    by a thread that does not exist here. Each lock opens its own on first use."""
    for lock in list(_LOCKS):
        lock._init_local()


os.register_at_fork(after_in_child=_forget_parents_locks)


class PodLock:
    """One exclusive lock for every thread of every process of the pod.

    ``acquire()`` waits as long as it takes (the holder releases it in microseconds, or
    dies, which releases it too; a holder stopped with SIGSTOP keeps it until it is
    continued); ``acquire(timeout=seconds)`` returns False after ``timeout`` seconds.
    Use ``with lock:`` for the unbounded form. Picklable (for ``spawn``): the copy opens
    the same file.
    """

    def __init__(self, prefix: str = "pgworker-lock-") -> None:
        fd, self.path = tempfile.mkstemp(prefix=prefix)
        os.close(fd)
        self._cleanup = weakref.finalize(self, _unlink, self.path)
        self._init_local()

    def _init_local(self) -> None:
        self._fd: int | None = None
        self._threads = threading.Lock()
        _LOCKS.add(self)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self._cleanup = None  # the creator removes the file, not a copy
        self._init_local()

    def _own_fd(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR)
        return self._fd

    def acquire(self, timeout: float | None = None) -> bool:
        """Take the lock; with ``timeout`` (seconds), give up and return False after it."""
        if timeout is None:
            self.__enter__()
            return True
        deadline = time.monotonic() + timeout
        if not self._threads.acquire(timeout=max(0.0, timeout)):
            return False
        taken = False
        try:
            fd = self._own_fd()
            pause = POLL_FIRST_SECONDS
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    taken = True
                    return True
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                time.sleep(min(pause, left))
                pause = min(pause * 2, POLL_MAX_SECONDS)
        finally:
            if not taken:
                self._threads.release()

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)  # type: ignore[arg-type]  # opened by the acquire
        self._threads.release()

    def __enter__(self) -> "PodLock":
        self._threads.acquire()
        try:
            fcntl.flock(self._fd if self._fd is not None else self._own_fd(), fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def close(self) -> None:
        """The creator: remove the lock file (processes that have it open keep working)."""
        if self._cleanup is not None:
            self._cleanup()


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
