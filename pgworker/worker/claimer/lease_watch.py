"""The claimer's own watch over its supervisor and its leases (the lease contract's rule 3).

The supervisor keeps a pod's leases (the renewer) and tells handlers when one is lost
(the lease clock). A supervisor killed (SIGKILL, OOM) or stopped (SIGSTOP) does neither,
and its claimers once noticed only between jobs: a running handler was never told, and
ran on while another pod, after the reaper, ran the job again (10 s of overlap seen
with a 6 s lease). So a thread of the claimer that already wakes often (the completer's
flusher) calls :meth:`LeaseWatch.tick`:

- the supervisor gone (its sentinel pipe reads EOF): no lease of this claimer will be
  renewed again, so every job it holds unstarted or running is marked ``lost`` now
  (:func:`pgworker.worker.lease.orphaned`), before its lease has even expired;
- otherwise, any of its leases presumed lost by the supervisor's own rule
  (:func:`pgworker.worker.lease.presumed_lost`) on this process's clock, for a
  supervisor that is stopped (or too slow to tick).

A handler sees the mark as with a live supervisor: ``ctx.check()`` raises ``LeaseLost``,
``ctx.lease_lost`` reads True. The claim loop then exits as it does when it finds its
supervisor gone between jobs (``Claimer.should_stop``).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import select
import time
from typing import Any, Callable

from ..lease import LeaseTerms, orphaned, presumed_lost
from ..shm import layout as s
from ..shm.slots import SlotTable, SlotTableBusy

log = logging.getLogger("pgworker.lease")

#: How often the watch looks (seconds): the supervisor's own tick.
WATCH_SECONDS = 0.2


class SupervisorSentinel:
    """Whether the supervisor that started this claimer is gone.

    ``parent_pid``: the supervisor's pid as it gave it. A claimer forked from the pod's
    fork server watches multiprocessing's parent sentinel (a pipe only the supervisor
    holds: EOF once it is gone, however early); a claimer run another way, its parent
    pid. One instance per thread: a ``select.poll`` object refuses concurrent calls.
    """

    def __init__(self, parent_pid: int) -> None:
        self.parent_pid = parent_pid
        self.poll: select.poll | None = None
        parent = multiprocessing.parent_process()
        if parent is not None:
            self.poll = select.poll()
            self.poll.register(parent.sentinel, select.POLLIN)

    def gone(self) -> bool:
        if self.poll is not None:
            return bool(self.poll.poll(0))  # readable: EOF, the supervisor's end is closed
        return os.getppid() != self.parent_pid


#: How often a claimer waiting for a quiet supervisor looks again (seconds).
SUPERVISOR_WAIT_POLL_SECONDS = 0.2


def wait_for_supervisor(table: SlotTable, terms: LeaseTerms, should_stop: Callable[[], bool],
                        beat: Callable[[], None], index: int) -> bool:
    """Claim nothing while the supervisor is stopped or late: no tick for a renewal
    interval (its tick writes the table's ``supervisor_at`` every 0.2 s). It would renew
    none of the new leases, and each job claimed would be presumed lost a lease later
    with its attempt spent: a pod whose supervisor was stopped (SIGSTOP) past a lease
    spent every attempt of its jobs that way, claiming one after another. Returns
    whether it waited; it resumes at the supervisor's next tick, and stops waiting when
    ``should_stop()`` (a supervisor gone is one). ``beat()`` keeps the loop's own
    heartbeat going (waiting is not a stalled loop)."""
    limit = terms.renew_interval_seconds
    quiet = table.supervisor_quiet(time.monotonic())
    if quiet < limit:
        return False
    log.warning("claimer %s claims nothing until its supervisor ticks again: no tick for %.1f s (the "
                "supervisor is stopped or late; it would renew no new lease)", index, quiet,
                extra={"action": "supervisor_quiet"})
    while not should_stop() and table.supervisor_quiet(time.monotonic()) >= limit:
        beat()
        time.sleep(SUPERVISOR_WAIT_POLL_SECONDS)
    log.info("claimer %s claims again: its supervisor ticks", index, extra={"action": "supervisor_back"})
    return True


class LeaseWatch:
    """Marks this claimer's leases lost when its supervisor cannot (see the module).

    ``supervisor_gone()`` says whether the supervisor is gone (None: a claimer run in a
    thread of the test process, nothing to watch); ``queue_name(view)`` names a slot's
    queue; ``metrics`` has ``renewals(queue, result, count)``.
    """

    def __init__(self, table: SlotTable, terms: LeaseTerms, supervisor_gone: Callable[[], bool] | None,
                 queue_name: Callable[[s.SlotView], str], metrics: Any, index: int) -> None:
        self.table = table
        self.terms = terms
        self.supervisor_gone = supervisor_gone
        self.queue_name = queue_name
        self.metrics = metrics
        self.index = index
        self.orphan = False  # the supervisor was found gone (said once)
        self.next_at = 0.0

    def tick(self, now: float | None = None) -> int:
        """Look, at most every WATCH_SECONDS; returns how many leases were newly marked lost."""
        now = time.monotonic() if now is None else now
        if now < self.next_at:
            return 0
        self.next_at = now + WATCH_SECONDS
        if not self.orphan and self.supervisor_gone is not None and self.supervisor_gone():
            self.orphan = True
            log.error("the supervisor is gone: the leases of claimer %s will not be renewed again; its "
                      "handlers are told their leases are lost, and it exits after them", self.index,
                      extra={"action": "supervisor_gone"})
        try:
            views = self.table.live()
        except SlotTableBusy:
            return 0  # the lock is held by a stopped process: the next tick tries again
        marked = 0
        for v in views:
            gone = self.orphan and orphaned(v)
            if not (gone or presumed_lost(self.terms, v, now)) or not self.table.try_mark_lost(v):
                continue
            marked += 1
            q = self.queue_name(v)
            self.metrics.renewals(q, "lost", 1)
            why = "its supervisor is gone" if gone else \
                f"presumed by the claimer, not renewed for {now - max(v.renewed_at, v.claimed_at):.1f} s " \
                f"(lease {self.terms.lease_seconds:.0f} s; the supervisor is stopped or late)"
            log.warning("lease lost on job %s (token %s): %s; its handler is told to stop", v.job_id, v.token, why,
                        extra={"action": "lease_lost", "job_id": v.job_id, "queue": q, "lease_token": v.token})
        return marked
