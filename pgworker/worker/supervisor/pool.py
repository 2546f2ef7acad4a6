"""The pod's claimer processes: start, watch, stop, restart, and say what a dead one held.

Each claimer is a process forked from the pod's fork server (:mod:`..forkserver`), with
its slot table in shared memory. The pool restarts a claimer that exits (at once when it
was recycled, with a backoff when it keeps crashing), stops one whose handler runs past its hard limit (a sync handler cannot
be interrupted: the process is killed and the attempt fails ``TIMEOUT``), and tells the
renewer whether the process holding a slot is alive and not stopped.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..shm import layout as s
from ..shm.slots import SlotTable, SlotTableBusy
from ..lease import past_hard_limit
from ..service import Backoff
from ..outcome import TIMEOUT
from ...retry import RetryPolicy

log = logging.getLogger("pgworker.worker")

# A claimer that dies within this long of its start is crashing: restart it after a
# backoff (0.5 s doubling to 30 s) rather than at once.
QUICK_EXIT_SECONDS = 5.0
RESTART_POLICY = RetryPolicy(base_seconds=0.5, factor=2.0, max_seconds=30.0, jitter=0.0)


@dataclass
class ClaimerHandle:
    index: int
    table: SlotTable
    process: Any = None
    started_at: float = 0.0
    restart_at: float = 0.0
    restarts: Backoff = field(default_factory=lambda: Backoff(RESTART_POLICY))
    kill_reasons: dict[int, str] = field(default_factory=dict)


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


def orphaned_claimer(pid: int) -> bool:
    """True while process ``pid`` runs (not a zombie) and is a fork of a fork server (its
    command line is the server's): a claimer whose exit the server can no longer report.
    Linux /proc; elsewhere False."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2:][:1] not in (b"Z", b"X") and b"multiprocessing.forkserver" in cmd


class ClaimerPool:
    """``count`` claimer processes; ``start_process(handle)`` spawns one."""

    def __init__(self, *, mp: Any, count: int, capacity: int, start_process: Callable[[ClaimerHandle], Any]) -> None:
        self.mp = mp
        self.handles = [ClaimerHandle(i, SlotTable(capacity, mp)) for i in range(count)]
        self.tables = [h.table for h in self.handles]
        for table in self.tables:  # alive from the start: a claimer waits for a quiet supervisor
            table.supervisor_beat()
        self.start_process = start_process

    def start(self) -> None:
        for h in self.handles:
            self.spawn(h)

    def spawn(self, h: ClaimerHandle) -> None:
        h.started_at = time.monotonic()  # before: the claimer's first beat must come after it
        h.process = self.start_process(h)
        h.kill_reasons = {}

    def sentinels(self) -> list[Any]:
        return [h.process.sentinel for h in self.handles if h.process is not None]

    def exited(self) -> list[ClaimerHandle]:
        """Handles whose process has exited (joined; ``process`` still set for its exit code)."""
        out = []
        for h in self.handles:
            if h.process is not None and not h.process.is_alive():
                if orphaned_claimer(h.process.pid):
                    # The fork server, which reports a claimer's exit, was killed (SIGKILL;
                    # it ignores SIGTERM): the claimer runs on, orphaned. A replacement on
                    # its slot table beside it would share the table, so stop it first; it
                    # counts as gone once it is (reaped by init, or a zombie).
                    _kill(h.process.pid, signal.SIGKILL)
                    continue
                h.process.join()
                out.append(h)
        return out

    def all_stopped(self) -> bool:
        return all(h.process is None for h in self.handles)

    def holder_alive(self, table: SlotTable, v: s.SlotView) -> bool:
        """Whether the process holding a slot is alive and not stopped (a slot being taken
        over is held by the claimer taking it)."""
        index = v.moved_to if v.state == s.MOVING and 0 <= v.moved_to < len(self.handles) else self.tables.index(table)
        p = self.handles[index].process
        return p is not None and p.is_alive() and not process_stopped(p.pid)

    def held_by(self, h: ClaimerHandle) -> tuple[list[s.SlotView], list[tuple[SlotTable, s.SlotView]]]:
        """What a gone claimer held: its own slots, and the slots of other tables it was
        taking over. (A lock it held, its own table's or a peer's, was released as it
        died: see :mod:`pgworker.worker.shm.lock`.)"""
        held = h.table.held()
        in_transit = []
        for other in self.handles:
            if other is h:
                continue
            try:
                in_transit += [(other.table, v) for v in other.table.held()
                               if v.state == s.MOVING and v.moved_to == h.index]
            except SlotTableBusy:
                continue
        return held, in_transit

    @staticmethod
    def failed_at_start(h: ClaimerHandle, exitcode: int | None) -> bool:
        """The claimer exited of its own accord (not by a signal) before its loop first
        ran: its set-up failed (the app module raised on import in the claimer, or called
        sys.exit(), say), and a replacement would fail the same way. Even with code 0 this
        is no recycle: a claimer recycles only after jobs, from its loop."""
        return exitcode is not None and exitcode >= 0 and h.table.header.loop_at < h.started_at

    def schedule_restart(self, h: ClaimerHandle, exitcode: int | None, pid: int | None, held: int, *,
                         failed_at_start: bool = False) -> None:
        now = time.monotonic()
        if exitcode == 0 and not failed_at_start:
            # recycled (max jobs or memory per child), however soon: not a crash, no backoff
            h.restart_at = now
            h.restarts.reset()
            return
        timed_out = [job_id for job_id, reason in h.kill_reasons.items() if reason == TIMEOUT]
        if timed_out and exitcode == -signal.SIGKILL:
            # stopped here for a handler past its time limit: that attempt's outcome, not a
            # crash (a break-it trial: each such kill soon after a start doubled a backoff,
            # 0.5 s to 30 s, and a drain run idled past its deadline with jobs due)
            h.restart_at = now
            h.restarts.reset()
            log.warning("claimer %s (pid %s) was stopped for job %s's time limit; replaced at once (held %s "
                        "job(s))", h.index, pid, ", ".join(map(str, timed_out)), held)
            return
        if now - h.started_at < QUICK_EXIT_SECONDS:
            delay = h.restarts.next()
        else:
            h.restarts.reset()
            delay = 0.0
        h.restart_at = now + delay
        log.error("claimer %s (pid %s) exited with code %s; restarting in %.1f s (held %s job(s))",
                  h.index, pid, exitcode, delay, held)

    def restart_due(self, now: float) -> None:
        for h in self.handles:
            if h.process is None and now >= h.restart_at:
                self.spawn(h)

    def enforce_hard_limits(self, now: float) -> None:
        """Stop attempts past their hard limit (the lease contract, rule 4)."""
        for h in self.handles:
            if h.process is None or not h.process.is_alive():
                continue
            try:
                views = h.table.live()
            except SlotTableBusy:
                continue
            for v in views:
                if past_hard_limit(v, now) and v.job_id not in h.kill_reasons:  # said and done once
                    log.error("job %s ran %.0f s, past its limit of %.0f s: stopping claimer %s",
                              v.job_id, now - v.started_at, v.hard_limit, h.index,
                              extra={"action": "timeout", "job_id": v.job_id})
                    h.kill_reasons[v.job_id] = TIMEOUT
                    _kill(h.process.pid, signal.SIGKILL)
                    break

    def drained(self) -> bool:
        """Drain mode: every claimer's last round found nothing, it waits, and holds nothing."""
        return all(h.process is not None and h.table.header.drained and h.table.header.idle
                   for h in self.handles) and not self.holding_jobs()

    def holding_jobs(self) -> bool:
        """Whether any claimer holds a job (claimed, running or deciding); a busy slot
        table counts as holding."""
        for h in self.handles:
            try:
                if h.table.live():
                    return True
            except SlotTableBusy:
                return True
        return False

    def ask_to_stop(self) -> None:
        for h in self.handles:
            h.table.header.stopping = 1
            h.table.wake.set()
            if h.process is not None and h.process.is_alive():
                _kill(h.process.pid, signal.SIGTERM)

    def hand_back_waiting(self, claimed_before: float) -> list[tuple[SlotTable, s.SlotView]]:
        """Every job waiting unstarted in a live claimer's batch since before
        ``claimed_before`` (monotonic), taken back from it (see SlotTable.hand_back_waiting)."""
        out = []
        for h in self.handles:
            if h.process is None or not h.process.is_alive():
                continue  # a gone claimer's slots are settled by _claimer_gone
            try:
                out += [(h.table, v) for v in h.table.hand_back_waiting(claimed_before)]
            except SlotTableBusy:
                continue
        return out

    def running_jobs(self, h: ClaimerHandle) -> list[int]:
        """Ids of the jobs whose handlers run in claimer ``h`` (empty if its table is busy)."""
        try:
            return [v.job_id for v in h.table.live() if v.state == s.RUNNING]
        except SlotTableBusy:
            return []

    def close(self) -> None:
        """Remove the tables' lock files (at the supervisor's exit)."""
        for h in self.handles:
            h.table.lock.close()

    def kill_all(self) -> None:
        for h in self.handles:
            if h.process is not None:
                _kill(h.process.pid, signal.SIGKILL)

    def claimer_problem(self, stall_seconds: float) -> str | None:
        """A claimer whose outcome writes, or claims, have failed for longer than
        ``stall_seconds``, said for /readyz; None when there is none."""
        now = time.monotonic()
        for h in self.handles:
            if h.process is None:
                continue
            for failing, what in ((h.table.write_failing(), "write job outcomes"), (h.table.claim_failing(), "claim jobs")):
                if failing is not None and now - failing[0] > stall_seconds:
                    since, reason = failing
                    return f"claimer {h.index} cannot {what} for {now - since:.0f} s ({reason})"
        return None


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
