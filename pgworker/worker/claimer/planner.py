"""The claimer's planner: which queue to ask next, how many jobs to ask for, and the
pod's share of a queue with a per-pod limit.

- rotation: the pod's queues in turn, a queue found empty skipped for
  ``EMPTY_QUEUE_RECHECK_SECONDS`` while another keeps the claimer busy, and a rate-limited
  queue not asked before its next token is due;
- batch size: about ``BATCH_TARGET_SECONDS`` of handler time (never more than half a
  lease), from the handlers' measured average, bounded by the free slots;
- reservation: a queue with ``queue_concurrency`` is claimed only up to the pod's share
  (:class:`~pgworker.worker.podlimits.PodQueueLimits`).

The claim itself and the run of a batch are :mod:`.runner`'s.
"""

from __future__ import annotations

import time

from .state import ClaimerState


# Auto batch sizing: claim about this much work at a time (seconds of handler time),
# and never more than half a lease's worth.
BATCH_TARGET_SECONDS = 1.0
INITIAL_BATCH = 10
WAIT_CHECK_SECONDS = 1.0
# How long a queue found empty is skipped while another queue keeps the claimer busy:
# also the longest a job notified on that queue waits behind a busy queue's batches.
EMPTY_QUEUE_RECHECK_SECONDS = 0.25


class Planner(ClaimerState):
    """The planning half of :class:`~.loop.Claimer` (its state lives there)."""

    def batch_size(self) -> int:
        st = self.settings
        free = self.table.free_count()
        avg = self.executor.avg_run_seconds
        if st.batch_size is not None:
            n = st.batch_size
        elif avg is None:
            n = INITIAL_BATCH
        else:
            budget = min(BATCH_TARGET_SECONDS, st.lease_seconds / 2)
            # at least one: jobs longer than the budget are still claimed, one at a time
            n = max(1, int(budget / max(avg, 1e-6)))
        return max(0, min(n, st.max_batch_size, free))

    def claim_round(self) -> bool | None:
        """Claim from each queue in turn until one returns jobs; run them. True if any ran,
        False if every queue was asked and gave nothing, None if a claim failed.

        A queue whose claim found nothing is not asked again for
        EMPTY_QUEUE_RECHECK_SECONDS while another queue keeps returning jobs: otherwise
        every batch of a busy queue costs an empty claim on each idle queue. A round that
        finds nothing asks every queue, so the idle and drain decisions stay exact.
        """
        now = time.monotonic()
        skipped: list[str] = []
        for _ in range(len(self.queues)):
            queue = self.queues[self.rotation % len(self.queues)]
            self.rotation += 1
            if self.empty_until.get(queue, 0.0) > now:
                skipped.append(queue)
                continue
            found = self._claim_and_run(queue)
            if found is not False:
                return found
        for queue in skipped:
            found = self._claim_and_run(queue)
            if found is not False:
                return found
        return False

    def _claim_and_run(self, queue: str) -> bool | None:
        """Claim from one queue and run what came: True if jobs ran (or no slot is free),
        False if the queue gave nothing (nothing due, rate limited, or the pod holds its
        share), None when the claim failed."""
        if self.retry_at.get(queue, 0.0) > time.monotonic():
            return False  # rate limited: its next token is not due yet
        limit = self.batch_size()
        if limit <= 0:
            self.completer.flush()
            limit = self.batch_size()
            if limit <= 0:
                if self.completer.backing_off():  # every slot holds an outcome refused for now: no spin
                    self.db.sleep(self.completer.backing_off())
                    return None
                return True
        granted = limit
        if self.pod_limits is not None and self.pod_limits.limits(queue):
            granted = self.pod_limits.reserve(self.index, queue, limit, self._held)
            if granted <= 0:
                return False  # this pod already holds its share of the queue
        try:
            jobs = self.claim(queue, granted)
        finally:
            if self.pod_limits is not None:
                self.pod_limits.claimed(self.index, queue, granted, self._held)
        if jobs is None:
            return None
        if not jobs:
            self.empty_until[queue] = time.monotonic() + EMPTY_QUEUE_RECHECK_SECONDS
            return False
        self.empty_until.pop(queue, None)
        wanted = len(jobs) - 1 + (1 if len(jobs) >= granted else 0)
        if wanted and self.signals is not None:
            # jobs wait in this batch (an idle peer takes each over), and a full claim
            # means more may be due (an idle peer claims it)
            self.signals.announce(self.peers, self.queue_index.get(queue, -1), exclude=self.index, count=wanted)
            self.metrics.wakeup("claim")
        self.run_batch(jobs)
        return True

    def _held(self, queue: str) -> int:
        """Jobs of ``queue`` this claimer holds (its non-empty slots)."""
        qi = self.queue_index.get(queue, -1)
        return sum(1 for i in self.table.held_queues() if i == qi)

    def _refresh_pod_limits(self) -> None:
        if self.pod_limits is not None:
            self.pod_limits.refresh(self.index, self._held)

    def _wait_seconds(self) -> float:
        """Until the next wake-up check: at most WAIT_CHECK_SECONDS, less when a
        rate-limited queue gets its next token sooner, or a job this claimer retried or
        snoozed falls due sooner (:mod:`.due_later`)."""
        now = time.monotonic()
        wait = WAIT_CHECK_SECONDS
        if self.retry_at:
            wait = min(wait, min(self.retry_at.values()) - now)
        due = self.due_later.seconds_to_next(now)
        if due is not None:
            wait = min(wait, due)
        return max(0.0, wait)

    def _retry_due(self) -> bool:
        """A rate-limited queue's token, or a job this claimer retried or snoozed, is due."""
        now = time.monotonic()
        return any(t <= now for t in self.retry_at.values()) or self.due_later.pop_due(now)
