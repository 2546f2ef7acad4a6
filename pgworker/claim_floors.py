"""Claim floors: where a claimer's next claim of a queue may start each priority's scan.

Why: a claim reads ``jobs_claim_idx`` (queue, priority DESC, run_at, id) from the start
of each priority's range. The entry of a job already claimed stays in the index until
VACUUM removes it, and while any snapshot older than that claim is held (a long report,
``pg_dump``, a standby query with ``hot_standby_feedback``) neither VACUUM nor an index
scan may: every claim then re-reads from the heap every job claimed since the snapshot
was taken, and claims slow down as the backlog drains (docs/benchmarks.md). A floor is a
position (run_at, id) below which a priority holds no claimable job: the scan starts
there, one index descent, past the dead entries (the id matters: a bulk enqueue gives
thousands of jobs one run_at).

A floor is safe because of the protocol of migration 0013 (its header says it whole):

- every statement that makes a job claimable with a fresh run_at stamps it, under a
  shared lock of the queue's bucket, with the clock read after the lock (``claim_stamp``);
- every statement that makes a job claimable with an older run_at, or locks a claimable
  job without changing it, bumps the bucket's epoch under that lock (``claim_backdate``);
- every claim returns its horizon: the epoch, then the clock T, then the bucket's lock
  tried exclusively (``claim_horizon``). Granted, every writer that locked before T has
  committed, and every later one stamps after T. Not granted (writers in flight), T is the
  start of the oldest writer's transaction: every job a writer stamps is stamped after
  it (None when a writer's start cannot be read).

So after a claim, given T from an earlier claim (taken before this claim's snapshot; and
never past the claim's own ``now()``, where its due range ends, which the claim returns),
no claimable job can exist or appear below ``min(T, what this claim saw)``, except:

1. a job made claimable with an older run_at since that earlier horizon: its bump shows
   as a new epoch at the next horizon, granted or not (the epoch is read first, and a
   sequence is seen at once), and the floors are dropped then: every claim walks from
   the start until a granted horizon, taken after the bump's transaction committed,
   makes the new epoch the baseline;
2. a job another session locked and released unchanged (the claim of a claimer or pod
   that died mid-claim, an operator's ``SELECT ... FOR UPDATE``): a claim skips a locked
   job, and its floor may pass it. A claimer whose claim failed bumps its queue's epoch
   before its next claim (:mod:`pgworker.worker.claimer.runner`); for the rest, every
   claimer drops its floors every ``reset_seconds`` (``claim_floor_reset_seconds``,
   default 10 s): such a job waits at most that long more.

How each floor moves after a claim that took ``jobs`` of ``allowance`` (all of them
capped at T; T is None until a horizon is granted, and then nothing is kept):

- a claim that took fewer than its allowance ran every arm to the end: each priority's
  floor is the (run_at, id) of its first job taken ((T, 0) if none), the floor of every
  priority not listed (``default``, a run_at) and the aging arm's floor are T (T minus the
  aging bound for the aging arm, whose range ends that much earlier);
- a full claim ran the priority arm down to the lowest priority it took (``p_last``): the
  priorities above it were read to the end (floor: their first job taken, else (T, 0)),
  p_last to its first job taken, the ones below not at all (unchanged); the aging arm, if
  it took fewer than the allowance, ran to its end (T minus the bound), else to its first
  job's run_at (its index holds no id: jobs of that run_at are read again).

Floors only ever rise between drops. A dropped floor is none: a full scan, the exact
claim. Drain mode drops them before it decides that nothing is left (``used``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable, Tuple

from .config import CLAIM_FLOOR_RESET_SECONDS
from .jobs import ClaimResult

# Floors kept per queue beyond the default: a claim walks at most 8 priorities on its
# own (claim.sql), and a known priority counts as one walked.
MAX_PRIORITIES = 8


# A position in a priority's range of jobs_claim_idx: (run_at, id).
Position = Tuple[datetime, int]


@dataclass
class QueueFloors:
    """One queue's floors and its last granted horizon."""

    priorities: dict[int, Position] = field(default_factory=dict)
    default: datetime | None = None   # priorities not in ``priorities``
    aged: datetime | None = None      # the aging arm (run_at order across priorities)
    horizon_at: datetime | None = None
    horizon_epoch: int | None = None
    dropped_at: float = 0.0            # monotonic time of the last drop
    used: bool = False                 # the last claim since the last drop started from a floor

    def drop(self, now: float) -> None:
        self.priorities.clear()
        self.default = self.aged = None
        self.dropped_at = now
        self.used = False

    def any(self) -> bool:
        return bool(self.priorities) or self.default is not None or self.aged is not None


class ClaimFloors:
    """A claimer's floors, per queue: :meth:`params` before a claim, :meth:`learn` after it.

    Not thread-safe (one claimer's claim loop). ``reset_seconds``: floors are dropped at
    least that often (>= 0; 0 drops them before every claim: every claim exact, as
    without floors). ``clock``: monotonic seconds (tests pass their own)."""

    def __init__(self, reset_seconds: float = CLAIM_FLOOR_RESET_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if reset_seconds < 0:
            raise ValueError(f"reset_seconds must be >= 0, got {reset_seconds!r}")
        self.reset_seconds = reset_seconds
        self.clock = clock
        self._queues: dict[str, QueueFloors] = {}

    def _of(self, queue: str) -> QueueFloors:
        qf = self._queues.get(queue)
        if qf is None:
            qf = self._queues[queue] = QueueFloors(dropped_at=self.clock())
        return qf

    def params(self, queue: str) -> dict[str, Any]:
        """The claim's floor parameters for ``queue`` (``job_claim``'s floor_priorities,
        floor_at, floor_id, floor_default, floor_aged; None where there is no floor)."""
        qf = self._of(queue)
        now = self.clock()
        if now - qf.dropped_at >= self.reset_seconds:
            qf.drop(now)
        qf.used = qf.any()
        prios = sorted(qf.priorities, reverse=True)
        return {"floor_priorities": prios or None, "floor_at": [qf.priorities[p][0] for p in prios] or None,
                "floor_id": [qf.priorities[p][1] for p in prios] or None,
                "floor_default": qf.default, "floor_aged": qf.aged}

    def learn(self, queue: str, result: ClaimResult) -> bool:
        """Move ``queue``'s floors after a claim that returned ``result`` (run with
        :meth:`params`' floors), and take its horizon. Returns True when the horizon's
        epoch differs from the baseline and floors were dropped: a job may have become
        claimable below them, so a claim that took nothing should be made again at once.

        The epoch is compared whether or not the horizon was granted (a bump is seen at
        once); only a granted horizon becomes the baseline (its T and epoch), since only
        then is every bump it counts committed. One not granted, while the epoch is the
        baseline's, moves T on to its time, the oldest writer's start."""
        qf = self._of(queue)
        changed = qf.horizon_epoch is not None and result.horizon_epoch != qf.horizon_epoch
        dropped = False
        if changed:
            dropped = qf.any()
            qf.drop(self.clock())
        elif qf.horizon_at is not None and result.allowance > 0:
            t = qf.horizon_at if result.due_until is None else min(qf.horizon_at, result.due_until)
            self._move(qf, result, t)
        if result.horizon_at is not None:
            if result.horizon_granted:
                qf.horizon_at, qf.horizon_epoch = result.horizon_at, result.horizon_epoch
            elif not changed and qf.horizon_at is not None:
                # writers in flight, none has bumped the epoch: each stamps after its
                # transaction's start, the oldest of which is horizon_at (both bounds hold)
                qf.horizon_at = max(qf.horizon_at, result.horizon_at)
        return dropped

    @staticmethod
    def _move(qf: QueueFloors, result: ClaimResult, t: datetime) -> None:
        jobs, n = result.jobs, result.allowance
        first: dict[int, Position] = {}
        for job in jobs:
            at = first.get(job.priority)
            if at is None or (job.run_at, job.id) < at:
                first[job.priority] = (job.run_at, job.id)
        top: Position = (t, 0)  # no job stamped after T sorts below it
        aged, ranked = jobs[:result.aged_count], jobs[result.aged_count:]
        bound = timedelta(seconds=result.aging_seconds) if result.aging_seconds is not None else None
        if len(jobs) < n:  # every arm ran to its end
            qf.priorities = {p: min(top, at) for p, at in first.items()}
            qf.default = t
            if bound is not None:
                qf.aged = t - bound
        else:
            if ranked:
                p_last = min(job.priority for job in ranked)
                for p in set(qf.priorities) | set(first):
                    if p > p_last:
                        qf.priorities[p] = min(top, first.get(p, top))
                    elif p == p_last:
                        qf.priorities[p] = min(top, first[p])
            if bound is not None:
                qf.aged = t - bound if len(aged) < n else min(t, aged[0].run_at)
        if len(qf.priorities) > MAX_PRIORITIES:  # a dropped priority falls back to the default: safe
            for p in sorted(qf.priorities)[:len(qf.priorities) - MAX_PRIORITIES]:
                del qf.priorities[p]

    def claim(self, store: Any, conn: Any, queue: str, **claim: Any) -> ClaimResult:
        """One claim of ``queue`` from these floors (``store.claim_batch(conn, queue=queue,
        floors=..., **claim)``), the floors moved after it; made again at once, from the
        start, when its horizon dropped the floors and it took nothing (a job may have
        become claimable below them). Raises what the claim raises. ``conn``'s claims are
        sequential (one claimer)."""
        for _ in range(2):
            result: ClaimResult = store.claim_batch(conn, queue=queue, floors=self.params(queue), **claim)
            if not self.learn(queue, result) or result.jobs or result.allowance <= 0:
                break
        return result

    def drop(self, queue: str | None = None) -> None:
        """Forget the floors of ``queue`` (None: every queue); the next claim is exact."""
        now = self.clock()
        for name, qf in self._queues.items():
            if queue is None or name == queue:
                qf.drop(now)

    def used(self) -> bool:
        """Whether the last claim of any queue started from a floor."""
        return any(qf.used for qf in self._queues.values())
