"""A claimer's header in its slot table: its loop beat, idle flag, outcome counts, and
the health of its claims and outcome writes. The claimer writes them; the supervisor
reads them (the loop-stall gauge, the drain summary, /readyz). The wake-up fields
(``idle``, ``hint_queue``) are also written by whoever wakes it (:mod:`.wakeups`)."""

from __future__ import annotations

import time
from typing import Any

from .layout import OUTCOME_FIELDS, WRITE_FAILURE_BYTES, fit
from .lock import PodLock


class HeaderAccess:
    """The header half of :class:`~.slots.SlotTable` (``header`` is the shared
    :class:`~.layout.Header`, ``lock`` the table's lock)."""

    header: Any
    lock: PodLock

    def beat(self, *, idle: bool | None = None) -> None:
        """The claimer's loop ran (monotonic clock); ``idle``: it goes to sleep / wakes."""
        self.header.loop_at = time.monotonic()
        if idle is not None:
            self.header.idle = 1 if idle else 0

    def supervisor_beat(self, now: float | None = None) -> None:
        """The supervisor ticked (monotonic clock): it renews this claimer's leases."""
        self.header.supervisor_at = time.monotonic() if now is None else now

    def supervisor_quiet(self, now: float) -> float:
        """Seconds since the supervisor's last tick (0.0 when none has ever ticked: a
        claimer with no supervisor, run in a test's thread)."""
        at = self.header.supervisor_at
        return max(0.0, now - at) if at else 0.0

    def count(self, outcome: str, n: int = 1) -> None:
        """Add ``n`` to one of OUTCOME_FIELDS."""
        with self.lock:  # the claimer's main and flusher threads both account their flushes
            setattr(self.header, outcome, getattr(self.header, outcome) + n)

    def outcome_counts(self) -> dict[str, int]:
        return {f: getattr(self.header, f) for f in OUTCOME_FIELDS}

    def write_health(self, failure: str | None) -> None:
        """Record whether outcome writes succeed (None) or fail, and why: the supervisor's
        /readyz names a claimer that cannot write outcomes."""
        self._health("write", failure)

    def write_failing(self) -> tuple[float, str] | None:
        """(monotonic start, reason) of the current run of failed outcome writes, or None."""
        return self._failing("write")

    def claim_health(self, failure: str | None, since: float | None = None) -> None:
        """Record whether claims succeed (None) or fail, and why, and since when
        (monotonic; default: now, unless already failing): the supervisor's /readyz names a
        claimer that cannot claim (its role's grants revoked while it runs, say, which the
        start's grants check cannot see) or cannot connect to claim."""
        self._health("claim", failure, since)

    def claim_failing(self) -> tuple[float, str] | None:
        """(monotonic start, reason) of the current run of failed claims, or None."""
        return self._failing("claim")

    def _health(self, what: str, failure: str | None, since: float | None = None) -> None:
        h = self.header
        failing_since = getattr(h, f"{what}_failing_since")
        if failure is None:
            if failing_since:
                setattr(h, f"{what}_failing_since", 0.0)
            return
        if since is not None or not failing_since:
            setattr(h, f"{what}_failing_since", since or time.monotonic())
        setattr(h, f"{what}_failure", fit(failure, WRITE_FAILURE_BYTES))

    def _failing(self, what: str) -> tuple[float, str] | None:
        h = self.header
        since = getattr(h, f"{what}_failing_since")
        if not since:
            return None
        return since, bytes(getattr(h, f"{what}_failure")).decode("utf-8", "replace")
