"""Job rows as the test helpers read them (statements ``testing_jobs`` and
``testing_job_counts``): filtered in SQL, newest first, and bounded, with the bound
reported rather than hidden (:class:`JobRead`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Sequence

import psycopg
from psycopg.types.json import Jsonb

from ..jobs import JobState
from ..store import Store

STATES = tuple(s.value for s in JobState)
# More candidates than any test means to look at; a bound so a runaway table cannot
# flood memory or a message. A read that hits it says so (JobRead.truncated).
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


@dataclass(frozen=True)
class JobRead:
    """The result of a bounded read: ``rows`` oldest first, the newest ``limit`` at most;
    ``truncated`` True when more rows matched than were kept (the older ones were not read)."""

    rows: list[JobRow]
    truncated: bool
    limit: int


def check_limit(limit: Any) -> int:
    """``limit`` (the most candidate rows a helper reads) as an int >= 1; raises ``ValueError``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an integer >= 1 (the most candidate jobs to read, default {ROWS_LIMIT:,}), "
                         f"got {limit!r}")
    return limit


def read_jobs(store: Store, conn: psycopg.Connection, *, ids: Sequence[int] | None = None,
              task: str | None = None, queue: str | None = None, states: Sequence[str] | None = None,
              payload: Any = None, exact_payload: bool = False, payload_contains: Any = None,
              limit: int = ROWS_LIMIT) -> JobRead:
    """The newest ``limit`` jobs matching every filter given (None: any), returned oldest first.

    ``payload`` with ``exact_payload=True``: the payload equals it as jsonb (so None
    means a JSON null payload, not "any"). ``payload_contains``: the payload contains it
    (jsonb ``@>``, which is looser than the helpers' match for arrays: check each row
    again). One row more than ``limit`` is asked for, so that ``truncated`` is known.
    """
    cur = conn.cursor(row_factory=psycopg.rows.kwargs_row(JobRow))
    rows = cur.execute(store.queries["testing_jobs"], {
        "ids": None if ids is None else list(ids), "task": task, "queue": queue,
        "states": None if states is None else list(states),
        "payload": Jsonb(payload) if exact_payload else None,
        "contains": None if payload_contains is None else Jsonb(payload_contains),
        "limit": limit + 1}).fetchall()
    truncated = len(rows) > limit
    return JobRead(rows=rows[:limit][::-1], truncated=truncated, limit=limit)


def count_jobs(store: Store, conn: psycopg.Connection, *,
               limit: int = ROWS_LIMIT) -> tuple[dict[tuple[str, str], int], bool]:
    """({(task, state): jobs} among the newest ``limit`` jobs, whether older ones exist)."""
    rows = conn.execute(store.queries["testing_job_counts"], {"limit": limit}).fetchall()
    return {(task, state): n for task, state, n, _ in rows if n}, any(beyond for *_, beyond in rows)


def fetch_jobs(store: Store, conn: psycopg.Connection, *, ids: Sequence[int]) -> list[JobRow]:
    """The jobs with these ids (those that exist), oldest first: a drain's final rows."""
    return read_jobs(store, conn, ids=ids, limit=max(len(ids), 1)).rows
