"""The settler: the supervisor's own fenced writes, for the jobs of a claimer that is gone.

A claimer that dies (kill -9, a segfault, the OOM killer, a timeout) leaves its slot
table behind, and the supervisor knows every lease in it, so its jobs are settled at
once rather than when their leases expire:

- a job that waited unstarted is released (no attempt spent);
- a job whose handler was running fails ``WORKER_DIED`` (or ``TIMEOUT`` when the
  supervisor stopped it), with its task's retry delay: the attempt counts, so a job that
  kills its worker every time ends dead. At shutdown, one still running when the grace
  ends fails ``SHUTDOWN``, due again at once: its attempt counts too (it once was
  released with the attempt given back, so a job longer than the grace ran again and
  again, starving the queue with no trace; now it ends dead, visible, after its
  attempts);
- a job whose outcome was decided, but not yet written, gets that outcome written as
  decided (the handler's success is not turned into a failure);
- a job a peer was taking over (MOVING) is the peer's to settle, unless the peer is the
  one that died before the job reached its table: then it is released. A taker that
  died after the job reached its table, but before it emptied the old slot, has the job
  settled from its own table, and the old slot emptied with it (it once stayed MOVING
  for good: a slot lost, the pod's per-queue count off, a drain that never ended).

Every write is fenced; a refused write whose outcome turns out to be already recorded
(the claimer's own write committed just before it died, or an earlier settlement whose
reply was lost) is counted as that outcome, by the completer's rule
(:func:`pgworker.worker.outcome.already_written`).
"""

from __future__ import annotations

import logging
import queue as queue_mod
import threading
from dataclasses import dataclass
from typing import Any, Callable

import psycopg

from ..names import schema_flag
from ..tasks import retry_delays
from .shm import layout as s
from .shm.slots import SlotTable, SlotTableBusy
from .outcome import (COMMITTED, COMPLETE, FAIL, PROVISIONAL, RELEASE, TIMEOUT, Write, already_written, slot_result,
                      write_outcomes, written_outcome)
from .service import Service

log = logging.getLogger("pgworker.worker")

WORKER_DIED = "WORKER_DIED"
SHUTDOWN = "SHUTDOWN"


@dataclass(frozen=True)
class Settlement:
    """One write for a slot of a gone claimer, with what the accounting needs."""

    write: Write
    queue: str
    task: str
    clear: Callable[[], None]  # empties the slot once settled
    handed_back: bool = False  # taken back from a live claimer's batch (not a gone claimer's job)


def settlements(held: list[s.SlotView], in_transit: list[tuple[SlotTable, s.SlotView]], *, app: Any,
                queue_name: Callable[[s.SlotView], str], kill_reasons: dict[int, str],
                clear: Callable[[s.SlotView], None]) -> list[Settlement]:
    """What to write for a gone claimer: its own ``held`` slots, and ``in_transit``, the
    slots of other tables it was taking over (see the module)."""
    task_names = sorted(app.tasks)
    delay = retry_delays(app.tasks)
    out = []
    own = {v.job_id for v in held}
    old_slots: dict[int, list[tuple[SlotTable, s.SlotView]]] = {}
    for table, v in in_transit:
        if v.job_id in own:  # moved into the gone claimer's table, the old slot not yet emptied
            old_slots.setdefault(v.job_id, []).append((table, v))
    for v in held:
        task = task_names[v.task_index] if 0 <= v.task_index < len(task_names) else "unknown"
        lease = _lease(v)
        if v.state in (s.MOVING, s.HANDED_BACK):
            continue  # a live peer takes it over and settles it; the supervisor releases a handed-back one
        moved_from = tuple(old_slots.get(v.job_id, ()))
        if v.outcome == COMMITTED:  # its transaction committed the success (the handler may still have run)
            w = Write(lease, COMMITTED)
        elif v.state in (s.DECIDED, s.WRITING) and v.outcome:
            if v.outcome == COMPLETE:  # the result, as the claimer kept it in the slot
                w = Write(lease, COMPLETE, result=slot_result(v.code, v.message))
            else:
                w = Write(lease, v.outcome, None, v.code or None, v.message, v.delay, v.permanent)
        elif v.state == s.CLAIMED:
            w = Write(lease, RELEASE)
        else:
            code = kill_reasons.get(v.job_id, WORKER_DIED)
            wait = 0.0 if code == SHUTDOWN else delay(task, max(v.attempt, 1))  # not the job's fault: due at once
            w = Write(lease, FAIL, None, code, _abandon_message(code), wait)
        out.append(Settlement(w, queue_name(v), task,
                              lambda v=v, moved_from=moved_from: (clear(v), [_clear(t, o) for t, o in moved_from])))
    for table, v in in_transit:
        if v.job_id not in own:
            out.append(Settlement(Write(_lease(v), RELEASE), queue_name(v), "unknown",
                                  lambda table=table, v=v: _clear(table, v)))
    return out


def hand_backs(taken: list[tuple[SlotTable, s.SlotView]], *, queue_name: Callable[[s.SlotView], str],
               task_names: list[str], cleared: Callable[[SlotTable, s.SlotView], None]) -> list[Settlement]:
    """Releases (no attempt spent) for the jobs the supervisor took back from live
    claimers' batches (``SlotTable.hand_back_waiting``): each slot is emptied once written,
    then ``cleared(table, view)`` is called (the pod's per-queue counts)."""
    def clear(t: SlotTable, v: s.SlotView) -> None:
        t.empty_handed_back(v.index, v.job_id, v.token)
        cleared(t, v)

    return [Settlement(Write(_lease(v), RELEASE), queue_name(v),
                       task_names[v.task_index] if 0 <= v.task_index < len(task_names) else "unknown",
                       lambda t=t, v=v: clear(t, v), handed_back=True) for t, v in taken]


def _lease(v: s.SlotView) -> Any:
    from ..jobs import Lease

    return Lease(v.job_id, v.token)


def _clear(table: SlotTable, v: s.SlotView) -> None:
    try:
        table.empty_settled([v])
    except SlotTableBusy:
        pass


def _abandon_message(code: str) -> str:
    if code == TIMEOUT:
        return "the attempt ran past its timeout or max runtime; its claimer process was stopped"
    if code == SHUTDOWN:
        return ("the worker was stopping and the attempt still ran when its shutdown grace ended; its claimer "
                "process was stopped (PGWORKER_SHUTDOWN_GRACE_SECONDS longer than the job avoids it)")
    return "the claimer process running this attempt died before recording an outcome"


def settle(store: Any, conn: psycopg.Connection, items: list[Settlement], metrics: Any,
           count: Callable[[str, int], None], retried: Callable[[float], None] = lambda delay: None) -> None:
    """Write ``items`` (fenced), count each outcome (``count(outcome, n)`` for the run's
    summary), and empty their slots; ``retried(delay_seconds)`` for each job written
    back to pending for a retry (a drain run waits for one due soon: no claimer wrote it,
    so none wakes for it). Raises psycopg errors (the caller retries)."""
    reports = write_outcomes(store, conn, [i.write for i in items], keys_known=False)
    refused = [i for i in items if i.write.lease.job_id not in reports[i.write.kind].accepted]
    recorded = already_written(store, conn, [i.write for i in refused]) if refused else set()
    for i in items:
        job_id = i.write.lease.job_id
        report = reports[i.write.kind]
        if job_id in report.accepted:
            outcome = written_outcome(i.write.kind, report.details.get(job_id))
        elif job_id in recorded:
            outcome = PROVISIONAL[i.write.kind]
        else:
            outcome = "lost"
            metrics.fenced(i.queue, report.operation)
        metrics.finished(i.queue, i.task, outcome, None, i.write.code if outcome in ("retried", "dead") else None)
        count(outcome, 1)
        if outcome == "retried":
            retried(i.write.delay)
        i.clear()
        if outcome == "dead":  # said once at ERROR, as the claimer says it for the jobs it settles
            flag = schema_flag(store.schema)
            log.error("job %s (task %r) is dead: %s: %s; see `pgworker jobs show %s%s`, replay with "
                      "`pgworker dead replay %s%s`", job_id, i.task, i.write.code, i.write.message, job_id, flag,
                      job_id, flag, extra={"action": "job_dead", "job_id": job_id, "queue": i.queue})
    abandoned = sum(1 for i in items if not i.handed_back)  # hand-backs are logged by the supervisor
    if abandoned:
        log.warning("settled %s job(s) of a stopped claimer", abandoned, extra={"action": "settle_abandoned"})


class Settler(Service):
    """Writes settlements queued by the supervisor, on its own connection."""

    name = "settler"
    action = "settling a stopped claimer's jobs"

    def __init__(self, *, store: Any, metrics: Any, count: Callable[[str, int], None],
                 retried: Callable[[float], None] = lambda delay: None, **kw: Any) -> None:
        super().__init__(**kw)
        self.store = store
        self.metrics = metrics
        self.count = count
        self.retried = retried
        self.queue: "queue_mod.Queue[list[Settlement]]" = queue_mod.Queue()
        # settlements handed over and not yet written (queued, or being written): a drain
        # run is not drained while any is, since the retry it writes is not known before
        # (the replaced claimer's first round found nothing: the job was still running)
        self._unsettled = 0
        self._count_lock = threading.Lock()

    def put(self, items: list[Settlement]) -> None:
        """Hand ``items`` over to be written (the supervisor's thread)."""
        with self._count_lock:
            self._unsettled += 1
        self.queue.put(items)

    def busy(self) -> bool:
        """Whether a settlement handed over with :meth:`put` is not written yet."""
        with self._count_lock:
            return self._unsettled > 0

    def has_work(self) -> bool:
        return not self.queue.empty()

    def next_delay(self) -> float:
        return 0.2

    def run_once(self, conn: psycopg.Connection) -> None:
        while True:
            try:
                items = self.queue.get_nowait()
            except queue_mod.Empty:
                return
            try:
                settle(self.store, conn, items, self.metrics, self.count, self.retried)
            except BaseException:
                self.queue.put(items)  # written again after the backoff, where the fence decides
                raise
            with self._count_lock:
                self._unsettled = max(0, self._unsettled - 1)
