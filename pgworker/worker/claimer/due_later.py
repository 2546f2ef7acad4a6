"""When the jobs a claimer's own writes made due later fall due: its wake-ups for them.

A retry (after its backoff) or a snooze becomes due with no notification: NOTIFY fires
on enqueue, and the only other wake-up of an idle claimer is the supervisor's fallback
poll (every poll interval, 2 s by default). So a retry with a 0.2 s backoff ran up to 2 s
late, and a drain run exited 37 ms before its own retries fell due, reporting nothing
left. The claimer that wrote the outcome knows when the job falls due: it records the
moment here, on the monotonic clock, measured after the write committed (so never before
the row's ``run_at`` on the database clock, which counted the delay from the statement),
and its idle wait ends then.

A drain run also stays up for the retries it wrote that fall due within one poll
interval (:meth:`DueLater.holds_drain`): a CronJob run would otherwise leave a retry
due in milliseconds to the next run, a schedule period later. Retries end (attempts are
bounded by max_attempts); snoozes need not (a snooze spends no attempt), so in a drain
run a snooze is left for the next run, as before: it neither holds the run open nor wakes
its claimer. Later retries stay for the next run (``next_due_seconds`` in its summary says
when).

Both are hints, as NOTIFY is: a wake-up that finds the job taken by another claimer
costs one empty claim; the table stays the truth and the fallback poll still runs.
"""

from __future__ import annotations

import heapq
import threading
import time

# Wake-ups kept at most; beyond it the latest are dropped (the fallback poll finds them).
MAX_WAKEUPS = 1_000


class DueLater:
    """The due times (monotonic seconds) of the jobs this claimer retried or snoozed.

    Written by the outcome writer (the flusher thread or the claim loop), read by the
    claim loop: one lock."""

    def __init__(self, drain_horizon_seconds: float, *, drain: bool = False) -> None:
        self.drain_horizon = drain_horizon_seconds
        self.drain = drain
        self._lock = threading.Lock()
        self._wakeups: list[float] = []  # a heap
        self._drain_hold_until = 0.0

    def add(self, delay_seconds: float, *, retry: bool, now: float | None = None) -> None:
        """A job this claimer wrote falls due ``delay_seconds`` from now (a retry, or a snooze)."""
        if self.drain and not retry:
            return  # a drain run leaves snoozes to the next run (see the module)
        now = time.monotonic() if now is None else now
        due = now + max(0.0, delay_seconds)
        with self._lock:
            if len(self._wakeups) < MAX_WAKEUPS:
                heapq.heappush(self._wakeups, due)
            elif due < max(self._wakeups):  # keep the soonest
                self._wakeups.remove(max(self._wakeups))
                heapq.heapify(self._wakeups)
                heapq.heappush(self._wakeups, due)
            if retry and delay_seconds <= self.drain_horizon:
                self._drain_hold_until = max(self._drain_hold_until, due)

    def seconds_to_next(self, now: float | None = None) -> float | None:
        """Seconds until the soonest recorded job falls due (0 when one is due), None when none is recorded."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return max(0.0, self._wakeups[0] - now) if self._wakeups else None

    def pop_due(self, now: float | None = None) -> bool:
        """Forget the jobs due by now; True when there was one (worth a claim)."""
        now = time.monotonic() if now is None else now
        popped = False
        with self._lock:
            while self._wakeups and self._wakeups[0] <= now:
                heapq.heappop(self._wakeups)
                popped = True
        return popped

    def holds_drain(self, now: float | None = None) -> bool:
        """A retry this claimer wrote falls due within the drain horizon and is not due yet."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return now < self._drain_hold_until
