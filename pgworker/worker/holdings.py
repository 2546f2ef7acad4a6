"""What each claimer of the pod holds now, read from its slot table: the one adapter the
pod registry (:mod:`.registry`) reads the slot tables through, so that nothing else of
the console depends on their layout."""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from .shm import layout as s
from .shm.slots import SlotTableBusy

#: Jobs listed per claimer (the registry row stays small; ``holding`` still counts them all).
HOLDS_LISTED = 20


def claimer_holdings(handles: Sequence[Any], *, queue_name: Callable[[s.SlotView], str],
                     task_names: Sequence[str], now: float | None = None) -> list[dict[str, Any]]:
    """One dict per claimer handle (``index``, ``table``, ``process``, as
    :class:`pgworker.worker.supervisor.pool.ClaimerHandle` has them): its pid, whether it is
    alive, idle or stopping, how many jobs it finished, and the jobs it holds (id, lease
    token, slot state, queue, task, seconds since the claim and since the handler
    started). A table whose lock is held too long reads ``busy`` with no jobs."""
    now = time.monotonic() if now is None else now
    out = []
    for h in handles:
        header = h.table.header
        process = h.process
        try:
            views, busy = h.table.held(), False
        except SlotTableBusy:
            views, busy = [], True
        out.append({
            "index": h.index, "pid": process.pid if process is not None else None,
            # not started yet: the registry's first row is written before the pool starts (a
            # trial's /workers said "exited" for 20 s of live claimers)
            "starting": process is None,
            "alive": bool(process is not None and process.is_alive()), "idle": bool(header.idle),
            "stopping": bool(header.stopping), "jobs_done": int(header.jobs_done), "busy": busy,
            "holding": len(views),
            "holds": [_hold(v, queue_name, task_names, now) for v in sorted(views, key=lambda v: v.order)[:HOLDS_LISTED]],
        })
    return out


def _hold(v: s.SlotView, queue_name: Callable[[s.SlotView], str], task_names: Sequence[str],
          now: float) -> dict[str, Any]:
    return {
        "job_id": v.job_id, "lease_token": v.token, "state": s.STATE_NAMES.get(v.state, str(v.state)),
        "queue": queue_name(v), "task": task_names[v.task_index] if 0 <= v.task_index < len(task_names) else None,
        "held_seconds": round(max(0.0, now - v.claimed_at), 1),
        "running_seconds": round(max(0.0, now - v.started_at), 1) if v.started_at else None,
        "lost": v.lost,
    }
