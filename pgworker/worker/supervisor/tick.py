"""The supervisor's tick: every ``SUPERVISE_TICK_SECONDS`` (or as soon as a claimer
exits) decide whether to stop, settle and replace claimers that exited, run the lease
clock, stop attempts past their hard limit, hand back jobs that waited too long, and
announce work on the fallback poll."""

from __future__ import annotations

import multiprocessing.connection
import signal
import time

from ..lease import LeaseClock
from .settlement import WAITING_HAND_BACK_SECONDS
from .state import SupervisorState

SUPERVISE_TICK_SECONDS = 0.2


class Tick(SupervisorState):
    """The tick half of :class:`~.main.Supervisor` (its state lives there)."""

    def _stop_reason(self, now: float) -> str | None:
        """Why a running pod stops now (a signal, the drain deadline, drained), or None."""
        if self.received:
            return f"signal {signal.Signals(self.received[0]).name}"
        if self.start_failure:
            return "a claimer failed at start-up"
        if self.max_duration is not None and now - self.run_started > self.max_duration:
            self.deadline_hit = True
            return "drain deadline"
        if self.drain and self.pool.drained() and not self._settling() \
                and not self.retry_hold.holds(now, lambda: self.announce(-1, "retry")):
            return "drained"
        return None

    def _settling(self) -> bool:
        """Whether a gone claimer's settlement is not written yet: the retry it writes is
        not known to the drain's hold before (a review found the run stopping "drained"
        in between, the replaced claimer having found its job still running)."""
        return self.settler is not None and self.settler.busy()

    def _supervise(self) -> int:
        clock = LeaseClock(self._terms(), lambda: self.pool.tables, self._queue_name, self.metrics)
        next_poll = time.monotonic() + self.settings.poll_interval_seconds
        next_hand_back = 0.0
        while True:
            now = time.monotonic()
            self.health.tick()
            if self.phase == "running":
                reason = self._stop_reason(now)
                if reason is not None:
                    self._begin_stop(reason)
            for h in self.pool.exited():
                self._claimer_gone(h)
            for table in self.pool.tables:  # alive: this pod's leases are renewed (claims wait otherwise)
                table.supervisor_beat(now)
            clock.tick(now)
            # timeouts hold while the pod stops too: a job past its limit fails TIMEOUT then
            # as ever (during the grace it once ran on, and its attempt was given back)
            self.pool.enforce_hard_limits(now)
            if self.phase == "running":
                if now >= next_hand_back:
                    next_hand_back = now + 1.0
                    self._hand_back(now - WAITING_HAND_BACK_SECONDS)
                self.pool.restart_due(now)
                if now >= next_poll and (not self.drain or self.pool.holding_jobs()):
                    # In drain mode while the pod holds a job: a retry or a job scheduled
                    # later that becomes due meanwhile is taken by an idle claimer, not left
                    # for the busy one (a drain run has no LISTEN). Never once nothing is
                    # held: a poll then could only keep waking claimers whose rounds find
                    # nothing, and a round longer than the poll interval (many queues, a
                    # slow network) would keep the run from ever counting as drained.
                    next_poll = now + self.settings.poll_interval_seconds
                    self.announce(-1, "poll")
            elif self.phase == "stopping":
                if self.pool.all_stopped():
                    break
                if now >= self.stop_deadline:
                    self._force_stop()
                    break
            multiprocessing.connection.wait(self.pool.sentinels(), timeout=SUPERVISE_TICK_SECONDS)
        return self._finish()

    def announce(self, queue_index: int, reason: str) -> None:
        """Work is due on a queue (-1: any): wake one idle claimer (pgworker.worker.shm.wakeups)."""
        if self.pool is not None:
            self.signals.announce(self.pool.tables, queue_index)
            self.metrics.wakeup(reason)
