"""Shutdown: stop claiming, hand back what waits, give running jobs the grace, then stop
the claimers, settle what they held, and (drain mode) report the run and choose the exit
code."""

from __future__ import annotations

import logging
import shlex
import signal
import time
from typing import Any

from ...names import schema_flag
from ..drain import report as report_drain
from ..settler import SHUTDOWN, settlements
from ..shm.slots import SlotTableBusy
from .state import SupervisorState

log = logging.getLogger("pgworker.supervisor")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_DRAIN_DEADLINE = 75  # EX_TEMPFAIL: the deadline passed with due work left; run again
# The signals that stop a pod gracefully (a second one: at once). SIGHUP, a closed terminal
# or ssh session, is one: by default it ended the supervisor at once, with no drain summary,
# its claimers orphaned (a break-it trial). Claimers and their fork server ignore SIGINT and
# SIGHUP, which reach the whole process group: the supervisor decides.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def signal_exit_code(signum: int) -> int:
    """128 + the signal's number, the shell's code for a run a signal ended: what a drain
    run exits with when a signal stopped it, gracefully (the first) or at once (a second).
    A script or a CronJob must tell a stopped drain from a completed one, which exits 0
    (the first Ctrl-C of a drain once exited 0, its summary saying "interrupted"); an
    always-on worker's graceful stop is its normal end and exits 0."""
    return 128 + signum


# How many of the due jobs left at a drain run's exit are probed for another
# transaction's row lock (the probe locks and releases each one it looks at).
LOCKED_PROBE_LIMIT = 100
# The due jobs of a paused queue counted at a drain run's exit, at most (a queue paused
# for a day may hold millions; the summary then says 10,000 and the log "10,000+").
PAUSED_COUNT_LIMIT = 10_000


class Shutdown(SupervisorState):
    """The shutdown half of :class:`~.main.Supervisor` (its state lives there)."""

    def _begin_stop(self, reason: str) -> None:
        log.info("stopping (%s): no new claims; running jobs have %.0f s to finish", reason,
                 self.settings.shutdown_grace_seconds)
        self.phase = "stopping"
        self.health.reason = "shutting down"  # not ready; still alive until the exit
        self.health.schema_ok = False
        self.stop_deadline = time.monotonic() + self.settings.shutdown_grace_seconds
        self.pool.ask_to_stop()
        self._hand_back(float("inf"))  # jobs not started are not held through the grace

    def _force_stop(self) -> None:
        alive = [h for h in self.pool.handles if h.process is not None]
        log.warning("shutdown grace over: stopping %s claimer(s); their running jobs fail SHUTDOWN (the attempt "
                    "counts) and are due again at once", len(alive))
        for h in alive:
            for job_id in self.pool.running_jobs(h):
                h.kill_reasons.setdefault(job_id, SHUTDOWN)
        self.pool.kill_all()
        for h in alive:
            h.process.join(timeout=5)
            self._claimer_gone(h)

    def _finish(self) -> int:
        self.stop_services.set()
        if self.settler is not None:  # what the settler had not written yet
            self.settler.join(5)
            while not self.settler.queue.empty():
                self._settle_now(self.settler.queue.get_nowait())
        for h in self.pool.handles:
            try:
                held, in_transit = self.pool.held_by(h)
            except SlotTableBusy:
                continue  # a killed claimer still in uninterruptible sleep holds its lock: its leases expire
            items = settlements(held, in_transit, app=self.app, queue_name=self._queue_name,
                                kill_reasons=h.kill_reasons, clear=lambda v: None)
            if items:
                self._settle_now(items)
            self.summary.add(h.table.reset_for_replacement())
        if not self.drain:
            log.info("stopped")
            return EXIT_OK
        return self._report_drain()

    def _report_drain(self) -> int:
        """Drain mode's end: count what is left, report the run, and the exit code."""
        # Due jobs left at exit, whatever ended the run: after "drained" it is normally 0
        # (a job that became due in the last moments, or one a global limit kept from
        # this run, shows here rather than being hidden).
        try:
            with self.connect("pgworker:supervisor") as conn:
                self.summary.left = self.store.due_count(conn, self.queues)
                self.summary.next_due_seconds = self.store.next_due_seconds(conn, self.queues)
                self._say_paused_left(conn)
                if self.summary.left > 0:
                    self._say_why_left(conn)
                elif self.summary.next_due_seconds is not None:  # a new user read "succeeded" as "all done"
                    log.info("drain: nothing due is left; the next job (a retry's backoff, a snooze, or one "
                             "scheduled later) is due in %.1f s, for the next run (next_due_seconds)",
                             self.summary.next_due_seconds, extra={"action": "drain_next_due"})
        except Exception as exc:  # noqa: BLE001
            log.error("could not count the jobs left: %s", type(exc).__name__)
            self.summary.left = -1
        if self.deadline_hit:
            self.summary.result = "deadline" if self.summary.left else "succeeded"
        if self.received:
            self.summary.result = "interrupted"
        elif self.start_failure or self.summary.maintenance_failed:
            self.summary.result = "failed"
        report_drain(self.summary, self.pushgateway_url, self.settings.schema)
        if self.received:
            return signal_exit_code(self.received[0])
        if self.start_failure or self.summary.maintenance_failed:
            return EXIT_ERROR
        if self.deadline_hit and self.summary.left:
            return EXIT_DRAIN_DEADLINE
        return EXIT_OK

    def _say_paused_left(self, conn: Any) -> None:
        """Count and log the due jobs of paused queues, which ``left`` leaves out (it
        counts what a claim could take): a run that processed nothing of a paused queue
        said "left": 0 and exited 0 without a word (a new user's trial)."""
        paused = self.store.due_paused(conn, self.queues, limit=PAUSED_COUNT_LIMIT)
        self.summary.left_paused = sum(paused.values())
        if not paused:
            return
        flag = schema_flag(self.settings.schema)
        each = ", ".join(f"{name!r} ({n:,}{'+' if n >= PAUSED_COUNT_LIMIT else ''} due)" for name, n in paused.items())
        resume = "; ".join(f"`pgworker queue resume {shlex.quote(name)}{flag}`" for name in list(paused)[:3])
        log.warning("drain: paused queue(s) %s: no run claims their jobs until resumed (%s); not counted in "
                    "left (left_paused)", each, resume, extra={"action": "drain_paused_left"})

    def _say_why_left(self, conn: Any) -> None:
        """Log the due jobs a drain run leaves, and how many of them another transaction
        held locked: a claim skips a locked row, so an operator's forgotten
        ``SELECT ... FOR UPDATE`` left them in silence (the summary's "left" alone)."""
        left = self.summary.left
        try:
            locked = self.store.due_locked_count(conn, self.queues, limit=LOCKED_PROBE_LIMIT)
        except Exception as exc:  # noqa: BLE001 - the count of what is left stands
            log.warning("drain: %d due job(s) left at exit (could not probe their locks: %s); the next run "
                        "takes them", left, type(exc).__name__)
            return
        probed = "" if left <= LOCKED_PROBE_LIMIT else f" of the first {LOCKED_PROBE_LIMIT} probed"
        if locked:
            why = (f"; {locked}{probed} held locked by another transaction, which a claim skips (an open "
                   "session's SELECT ... FOR UPDATE or UPDATE, or another worker's claim at that moment: "
                   "pg_locks and pg_stat_activity show the holder)")
        else:
            why = f" ({self._left_unlocked_because()}; none{probed} held locked)"
        log.warning("drain: %d due job(s) left at exit%s; the next run takes them", left, why)

    def _left_unlocked_because(self) -> str:
        if self.received:
            return "the run was stopped by a signal"
        if self.start_failure:
            return "a claimer failed at start-up"
        if self.deadline_hit:
            return "the run reached --max-duration"
        return "due in the run's last moments, or held back by a queue's limit"
