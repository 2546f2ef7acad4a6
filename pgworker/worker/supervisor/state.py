"""What the supervisor's halves share: the state :class:`~.main.Supervisor` builds and
the tick, settlement and shutdown read (declared once)."""

from __future__ import annotations

from typing import Any


class SupervisorState:
    """The attributes of :class:`~.main.Supervisor` its halves use (see its ``__init__``)."""

    phase: str
    pool: Any
    settings: Any
    metrics: Any
    health: Any
    signals: Any
    drain: bool
    received: list[int]
    max_duration: float | None
    run_started: float
    deadline_hit: bool
    start_failure: str | None  # drain mode: why a claimer's set-up failed (the run then fails)
    stop_deadline: float
    app: Any
    store: Any
    connect: Any
    pod_limits: Any
    settler: Any
    retry_hold: Any  # .tick.RetryHold: retries the supervisor wrote that a drain run waits for
    summary: Any
    queues: list[str]
    _task_names: list[str]
    stop_services: Any
    pushgateway_url: str | None
