"""Job rows as the test helpers read them (statement ``testing_jobs``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Sequence

import psycopg

from ..jobs import JobState
from ..store import Store

STATES = tuple(s.value for s in JobState)
# More rows than any test means to look at; a bound so a runaway table cannot flood a message.
ROWS_LIMIT = 10_000


@dataclass(frozen=True)
class JobRow:
    """One job as stored. ``payload`` is the decoded JSON; ``state`` one of pending,
    running, succeeded, dead, cancelled; ``run_at`` when it is (or was) due;
    ``attempts`` how many attempts started; ``errors`` the recorded failures, oldest
    first (dicts with attempt, at, code, message, worker); times are timezone-aware."""

    id: int
    task: str
    queue: str
    payload: Any
    state: str
    priority: int
    run_at: datetime
    attempts: int
    max_attempts: int
    last_error_code: str | None
    errors: list[dict[str, Any]]
    dedupe_key: str | None
    ordering_key: str | None
    created_at: datetime
    finished_at: datetime | None


def check_states(state: "str | Iterable[str] | None") -> list[str] | None:
    """``state`` as a list of state names (None: any state); raises ``ValueError`` naming
    the valid states."""
    if state is None:
        return None
    states = [state] if isinstance(state, str) else list(state)
    bad = [s for s in states if s not in STATES]
    if bad or not states:
        raise ValueError(f"state must be one of {', '.join(STATES)} (or a list of them, or None for any), "
                         f"got {state!r}")
    return states


def task_name(task: Any) -> str | None:
    """A task given as a name or a registered :class:`pgworker.Task` (None: any task)."""
    if task is None or isinstance(task, str):
        return task
    name = getattr(task, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"task must be a task name or a pgworker.Task, got {type(task).__name__}")
    return name


def fetch_jobs(store: Store, conn: psycopg.Connection, *, ids: Sequence[int] | None = None,
               task: str | None = None, queue: str | None = None, states: Sequence[str] | None = None,
               limit: int = ROWS_LIMIT) -> list[JobRow]:
    """Jobs matching every filter given (None: any), oldest first, at most ``limit``."""
    cur = conn.cursor(row_factory=psycopg.rows.kwargs_row(JobRow))
    return cur.execute(store.queries["testing_jobs"], {
        "ids": None if ids is None else list(ids), "task": task, "queue": queue,
        "states": None if states is None else list(states), "limit": limit}).fetchall()
