"""What a claimer's halves share: the state :class:`~.loop.Claimer` builds and the
planner and runner read (declared once, for the readers and the type checker)."""

from __future__ import annotations

from typing import Any

from ...claim_floors import ClaimFloors


class ClaimerState:
    """The attributes of :class:`~.loop.Claimer` its halves use (see its ``__init__``)."""

    app: Any
    settings: Any
    lease_terms: Any
    index: int
    table: Any
    peers: list[Any]
    signals: Any
    queues: list[str]
    queue_index: dict[str, int]
    task_index: dict[str, int]
    store: Any
    db: Any
    executor: Any
    completer: Any
    due_later: Any
    metrics: Any
    pod_limits: Any
    worker_id: str
    rotation: int
    jobs_done: int
    batch: dict[int, tuple[Any, int]]
    empty_until: dict[str, float]
    retry_at: dict[str, float]
    claims_failing: dict[str, float]
    limited_queues: set[str]
    floors: ClaimFloors
    epoch_bumps: set[str]
    peer_jobs: Any
    _slot_policies: dict[str, tuple[float, int, int]]
