"""Settlement: what the supervisor writes for jobs no live claimer will finish.

A claimer that exited has its slots settled (:func:`pgworker.worker.settler.settlements`)
and its table wiped for its replacement; jobs that waited unstarted too long in a live
claimer's batch are handed back (released, no attempt spent). The writes go through the
settler service while the pod runs, on a connection of their own at shutdown.
"""

from __future__ import annotations

import logging
from typing import Any

from ... import metrics_files
from ..settler import hand_backs, settle, settlements
from ..shm.layout import SlotView
from ..shm.slots import SlotTableBusy
from .pool import ClaimerHandle
from .state import SupervisorState

log = logging.getLogger("pgworker.supervisor")

# A job waiting unstarted in a claimer's batch this long (ten batch targets, see
# claimer/planner.py) is handed back to the table for any pod to run: its claimer is stuck
# behind a longer job than its batch sizing expected.
WAITING_HAND_BACK_SECONDS = 10.0


class Settlement(SupervisorState):
    """The settlement half of :class:`~.main.Supervisor` (its state lives there)."""

    def _claimer_gone(self, h: ClaimerHandle) -> None:
        exitcode, pid = h.process.exitcode, h.process.pid
        failed_at_start = self.pool.failed_at_start(h, exitcode)
        try:
            held, in_transit = self.pool.held_by(h)
        except SlotTableBusy:
            return  # a peer stopped (SIGSTOP) inside its table holds the lock: a later tick settles it
        stopping = self.phase != "running"
        items = settlements(held, in_transit, app=self.app, queue_name=self._queue_name,
                            kill_reasons=h.kill_reasons, clear=lambda v: None)
        h.process = None
        if pid:  # before its replacement starts: a new claimer may get the same pid
            metrics_files.process_gone(pid)
        if items:
            if stopping:
                self._settle_now(items)
            else:
                self.settler.put(items)
        if self.pod_limits is not None:
            self.pod_limits.drop_claimer(h.index)  # its jobs are being settled: no longer the pod's
        self.summary.add(h.table.reset_for_replacement())
        if stopping:
            return
        if self.drain and failed_at_start:
            # a drain run is a CronJob's: restarting it every 30 s until the Job's deadline
            # would hide the failure; the run stops and exits 1
            self.start_failure = (f"claimer {h.index} (pid {pid}) exited with code {exitcode} before its first "
                                  "claim (its error, if it raised one, is in the log above)")
            log.error("%s; a drain run does not restart it: the run stops and exits 1", self.start_failure)
            h.restart_at = float("inf")  # restart_due runs later in this same tick
            return
        self.pool.schedule_restart(h, exitcode, pid, len(held), failed_at_start=failed_at_start)

    def _settle_now(self, items: list[Any]) -> None:
        """At shutdown, settle on a connection of its own: the services are stopping."""
        try:
            with self.connect("pgworker:settler") as conn:
                settle(self.store, conn, items, self.metrics, self._count, self.retry_hold.add)
        except Exception as exc:  # noqa: BLE001 - the leases expire and a reaper recovers the jobs
            log.error("could not settle jobs at shutdown (%s): their leases will expire and a reaper "
                      "will recover them", type(exc).__name__)

    def _count(self, outcome: str, n: int) -> None:
        self.summary.add({outcome: n})

    def _queue_name(self, v: SlotView) -> str:
        return self.queues[v.queue_index] if 0 <= v.queue_index < len(self.queues) else "default"

    def _hand_back(self, claimed_before: float) -> None:
        """Release (fenced, no attempt spent) the jobs that have waited unstarted in a
        claimer's batch since before ``claimed_before`` (monotonic), so that any claimer of
        any pod may run them: a batch held behind a long or hung handler once kept its
        other jobs from idle pods until the handler ended (up to its max runtime)."""
        taken = self.pool.hand_back_waiting(claimed_before)
        if not taken:
            return
        items = hand_backs(taken, queue_name=self._queue_name, task_names=self._task_names, cleared=self._handed_back)
        log.info("handing back %s job(s) that waited unstarted behind a running one%s", len(items),
                 " (stopping)" if self.phase != "running" else f" for more than {WAITING_HAND_BACK_SECONDS:.0f} s",
                 extra={"action": "hand_back"})
        if self.settler is not None:
            self.settler.put(items)
        else:
            self._settle_now(items)

    def _handed_back(self, table: Any, v: SlotView) -> None:
        """A handed-back job left its claimer's slots: its share of a per-pod queue limit too."""
        if self.pod_limits is not None and self.pool is not None:
            self.pod_limits.release(self.pool.tables.index(table), self._queue_name(v))
