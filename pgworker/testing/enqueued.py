"""Assertions on what was enqueued: ``assert_enqueued``, ``refute_enqueued``, ``enqueued_jobs``.

A failure says what was enqueued instead: every job of the task with the reasons it
did not match (state, queue, and the payload's differences key by key), and a count of
the other jobs by task and state.
"""

from __future__ import annotations

import difflib
import json
from collections import Counter
from typing import Any, Iterable

from ..names import check_queue_name
from .rows import JobRow, check_states, fetch_jobs, task_name

SHOWN_JOBS = 20        # jobs listed in a failure message
SHOWN_DIFFERENCES = 8  # payload differences listed per job
VALUE_CHARS = 160      # a value in a message is cut to this many characters


class _Any:
    def __repr__(self) -> str:
        return "ANY"


ANY: Any = _Any()
"""The default of ``payload=``: any payload (None is a payload, so it cannot mean that)."""


def enqueued_jobs(app: Any, task: Any = None, *, queue: str | None = None,
                  state: "str | Iterable[str] | None" = None) -> list:
    """The jobs in ``app``'s schema, oldest first, as :class:`~pgworker.testing.rows.JobRow`.

    ``task``: a name or a :class:`pgworker.Task` (None: any). ``queue``: a queue name
    (None: any). ``state``: 'pending', 'running', 'succeeded', 'dead', 'cancelled', a
    list of them, or None (default: any state). Raises ``ValueError`` for an unknown state.
    """
    states = check_states(state)
    if queue is not None:
        check_queue_name(queue)
    with app.connection() as conn:
        return fetch_jobs(app.store, conn, task=task_name(task), queue=queue, states=states)


def assert_enqueued(app: Any, task: Any, payload: Any = ANY, *, payload_contains: dict | None = None,
                    queue: str | None = None, state: "str | Iterable[str] | None" = "pending",
                    count: int | None = None) -> list[JobRow]:
    """Assert that jobs of ``task`` matching the filters are in ``app``'s schema.

    ``task``: a name or a :class:`pgworker.Task` (None: any task). ``payload``: the exact
    payload, compared as JSON (a tuple equals a list, ``True`` is not ``1``; default any).
    ``payload_contains``: a dict whose keys must be in the payload with these values (nested
    dicts are matched the same way, lists and other values exactly). ``queue``: None for
    any. ``state``: 'pending' (default), another state, a list of states, or None for any.
    ``count``: None means at least one match; a number means exactly that many.

    Returns the matching jobs, oldest first. Raises ``AssertionError`` listing what was
    enqueued instead and how each job of the task differs; ``ValueError`` or
    ``TypeError`` for bad arguments.
    """
    match = _Matcher(task, payload, payload_contains, queue, state)
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise ValueError(f"count must be an integer >= 0 (exactly that many jobs), or None (at least one), got {count!r}")
    jobs = _all_jobs(app)
    found = [j for j in jobs if match.matches(j)]
    if count is None and found:
        return found
    if count is not None and len(found) == count:
        return found
    if count is None:
        head = f"expected a {match.describe()}, found none."
    else:
        head = f"expected exactly {count} job(s) matching [{match.describe()}], found {len(found)}."
    raise AssertionError(head + "\n" + _explain(app, match, jobs, found))


def refute_enqueued(app: Any, task: Any, payload: Any = ANY, *, payload_contains: dict | None = None,
                    queue: str | None = None, state: "str | Iterable[str] | None" = "pending") -> None:
    """Assert that no job matches (arguments as for :func:`assert_enqueued`).

    Raises ``AssertionError`` listing the jobs that match.
    """
    match = _Matcher(task, payload, payload_contains, queue, state)
    found = [j for j in _all_jobs(app) if match.matches(j)]
    if found:
        listed = "\n".join(f"  {_job_line(j)}" for j in found[:SHOWN_JOBS])
        more = f"\n  ... and {len(found) - SHOWN_JOBS} more" if len(found) > SHOWN_JOBS else ""
        raise AssertionError(f"expected no {match.describe()}, found {len(found)}:\n{listed}{more}")


def _all_jobs(app: Any) -> list[JobRow]:
    with app.connection() as conn:
        return fetch_jobs(app.store, conn)


class _Matcher:
    """One assertion's filters, checked once, and the reasons a job does not match them."""

    def __init__(self, task: Any, payload: Any, payload_contains: Any, queue: str | None,
                 state: "str | Iterable[str] | None") -> None:
        self.task = task_name(task)
        self.states = check_states(state)
        if queue is not None:
            check_queue_name(queue)
        self.queue = queue
        if payload is not ANY and payload_contains is not None:
            raise ValueError("give payload= (the exact payload) or payload_contains= (some of its keys), not both")
        if payload_contains is not None and not isinstance(payload_contains, dict):
            raise TypeError(f"payload_contains must be a dict of the keys the payload must have, got "
                            f"{type(payload_contains).__name__}; for any other payload use payload=")
        self.exact = payload is not ANY
        self.payload = _as_json(payload, "payload") if self.exact else None
        self.contains = _as_json(payload_contains, "payload_contains") if payload_contains is not None else None

    def mismatches(self, job: JobRow) -> list[str]:
        """Why ``job`` does not match (empty: it matches)."""
        out = []
        if self.task is not None and job.task != self.task:
            out.append(f"task is {job.task!r}")
        if self.states is not None and job.state not in self.states:
            out.append(f"state is {job.state}, not {' or '.join(self.states)}")
        if self.queue is not None and job.queue != self.queue:
            out.append(f"queue is {job.queue!r}, not {self.queue!r}")
        if self.exact:
            out += differences(self.payload, job.payload, "payload", subset=False)
        elif self.contains is not None:
            out += differences(self.contains, job.payload, "payload", subset=True)
        return out

    def matches(self, job: JobRow) -> bool:
        return not self.mismatches(job)

    def describe(self) -> str:
        """'pending job of task 'x' in queue 'q' with payload == {...}'."""
        states = "job" if self.states is None else f"{' or '.join(self.states)} job"
        parts = [states + ("" if self.task is None else f" of task {self.task!r}")]
        if self.queue is not None:
            parts.append(f"in queue {self.queue!r}")
        if self.exact:
            parts.append(f"with payload == {_short(self.payload)}")
        elif self.contains is not None:
            parts.append(f"with a payload containing {_short(self.contains)}")
        return " ".join(parts)


def _explain(app: Any, match: _Matcher, jobs: list[JobRow], found: list[JobRow]) -> str:
    """What was enqueued: the task's jobs with their mismatches, then the others by count."""
    if not jobs:  # a misspelt task name is as likely here as with other jobs about
        return f"No job at all is in schema {app.settings.schema!r}" + _registration_hint(app, match.task) + "."
    mine = [j for j in jobs if match.task is None or j.task == match.task]
    lines = []
    if not mine:
        lines.append(f"No job of task {match.task!r} is in schema {app.settings.schema!r}"
                     + _registration_hint(app, match.task) + ".")
    else:
        what = "Jobs" if match.task is None else f"Jobs of task {match.task!r}"
        lines.append(f"{what} ({len(mine)}, any state or queue):")
        for j in mine[:SHOWN_JOBS]:
            why = match.mismatches(j)
            lines.append(f"  {_job_line(j)}" + ("  <- matches" if not why else ""))
            lines += [f"      {reason}" for reason in why[:SHOWN_DIFFERENCES]]
            if len(why) > SHOWN_DIFFERENCES:
                lines.append(f"      ... and {len(why) - SHOWN_DIFFERENCES} more differences")
        if len(mine) > SHOWN_JOBS:
            lines.append(f"  ... and {len(mine) - SHOWN_JOBS} more")
    listed = {j.id for j in mine}
    others = Counter((j.task, j.state) for j in jobs if j.id not in listed)
    if others:
        by_task: dict[str, list[str]] = {}
        for (task, state), n in sorted(others.items()):
            by_task.setdefault(task, []).append(f"{state} {n}")
        lines.append("Other jobs: " + "; ".join(f"{t!r} ({', '.join(s)})" for t, s in by_task.items()) + ".")
    return "\n".join(lines)


def _registration_hint(app: Any, task: str | None) -> str:
    if task is None or task in getattr(app, "tasks", {}):
        return ""
    known = ", ".join(repr(t) for t in sorted(app.tasks)) or "none"
    close = difflib.get_close_matches(task, list(app.tasks), n=1, cutoff=0.6)
    meant = f"; did you mean {close[0]!r}?" if close else ""
    return f" (and no task of that name is registered on this App: registered are {known}{meant})"


def _job_line(j: JobRow) -> str:
    return f"job {j.id}: {j.state}, queue {j.queue!r}, task {j.task!r}, payload {_short(j.payload)}"


def differences(expected: Any, actual: Any, path: str, *, subset: bool) -> list[str]:
    """How ``actual`` (a stored JSON value) differs from ``expected``, one line per
    difference with its path; empty when they match. ``subset``: a dict in ``expected``
    only needs its own keys in ``actual`` (recursively); otherwise values match exactly.
    Numbers compare by value (1 == 1.0), but never a boolean with a number."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = []
        for key, value in expected.items():
            if key not in actual:
                out.append(f"{path}[{key!r}] is missing (expected {_short(value)})")
            else:
                out += differences(value, actual[key], f"{path}[{key!r}]", subset=subset)
        if not subset:
            out += [f"{path}[{key!r}] is not expected (got {_short(value)})"
                    for key, value in actual.items() if key not in expected]
        return out
    if isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        out = []
        for i, (e, a) in enumerate(zip(expected, actual)):
            out += differences(e, a, f"{path}[{i}]", subset=False)
        return out
    if _same_scalar(expected, actual):
        return []
    return [f"{path}: expected {_short(expected)}, got {_short(actual)}"]


def _same_scalar(a: Any, b: Any) -> bool:
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        return False
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def _as_json(value: Any, name: str) -> Any:
    """``value`` as it comes back from a jsonb column (tuples become lists, a dataclass or
    pydantic model the dict enqueue stores for it, ...)."""
    from ..payloads import to_json_value

    try:
        return json.loads(json.dumps(value, allow_nan=False, default=to_json_value))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name}= must be JSON-serialisable like a job's payload: {exc}") from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= VALUE_CHARS else text[:VALUE_CHARS - 3] + "..."
