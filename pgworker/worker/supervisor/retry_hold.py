"""A drain run waits for the retries the supervisor wrote that fall due soon.

A claimer that writes a retry due within one poll interval holds its drain run open
until the retry is due, and wakes itself for it (claimer/due_later.py). The supervisor
writes retries too: for the running job of a claimer it stopped (a sync handler past its
timeout: TIMEOUT) or that died (WORKER_DIED). No claimer wrote those, so none held the
run or woke for them: the drain exited 0, "nothing due is left; the next job is due in
0.7 s" (a new user's trial), leaving the retry to the next run, a schedule period later.

So the settler reports each retry it wrote (:meth:`RetryHold.add`, from its thread), and
the tick keeps the run from counting as drained until the latest one within the horizon
is due, then wakes an idle claimer for it, and holds a moment more
(:data:`WAKE_MARGIN_SECONDS`) so that the woken claimer's round, not the flags of rounds
before it, decides whether the run is drained. A hint, as every wake-up is: a retry the
run leaves is counted in the summary's ``left`` or ``next_due_seconds``, and never lost.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

# How long after waking a claimer for a due retry the run still does not count as drained:
# the woken claimer clears its drained flag as it wakes (an Event, microseconds), so two
# supervisor ticks are ample; losing that race only leaves the retry to the next run.
WAKE_MARGIN_SECONDS = 0.4


class RetryHold:
    """The due time (monotonic) of the latest retry the supervisor wrote that a drain run
    waits for. ``horizon_seconds``: only retries due within it hold the run (the poll
    interval, as for a claimer's own); ``drain``: False makes it hold nothing (an
    always-on worker's fallback poll and LISTEN find its retries)."""

    def __init__(self, horizon_seconds: float, *, drain: bool) -> None:
        self.horizon = horizon_seconds
        self.drain = drain
        self._lock = threading.Lock()
        self._due_at = 0.0  # the latest retry's due time; 0: none held
        self._woken_at: float | None = None  # when a claimer was woken for it

    def add(self, delay_seconds: float, now: float | None = None) -> None:
        """A retry was written, due ``delay_seconds`` from ``now`` (monotonic; the
        settler's thread calls it as the write commits)."""
        if not self.drain or delay_seconds > self.horizon:
            return  # a later retry is the next run's (next_due_seconds says when)
        due = (time.monotonic() if now is None else now) + max(0.0, delay_seconds)
        with self._lock:
            if due > self._due_at:
                self._due_at = due
                self._woken_at = None

    def holds(self, now: float, wake: Callable[[], None]) -> bool:
        """Whether the run must not count as drained at ``now`` (monotonic); calls
        ``wake()`` once the latest retry is due, to wake an idle claimer for it."""
        with self._lock:
            if self._due_at == 0.0:
                return False
            if now < self._due_at:
                return True
            if self._woken_at is None:
                self._woken_at = now
                woke = True
            else:
                woke = False
            holding = now < self._woken_at + WAKE_MARGIN_SECONDS
        if woke:
            wake()
        return holding
