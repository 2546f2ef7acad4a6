"""Assertions on what was enqueued: ``assert_enqueued``, ``refute_enqueued``, ``enqueued_jobs``.

A failure says what was enqueued instead: the task's newest jobs with the reasons they
did not match (state, queue, and the payload's differences key by key), and a count of
the other jobs by task and state.

The filters (task, queue, state, payload) apply in SQL, the newest candidates first, at
most ``limit`` of them; a read cut there fails (or says so in its failure) rather than
answer from part of the table.
"""

from __future__ import annotations

import difflib
import json
from typing import Any, Iterable

from ..names import check_queue_name
from .rows import ROWS_LIMIT, JobRead, JobRow, check_limit, check_states, count_jobs, read_jobs, task_name

SHOWN_JOBS = 20        # jobs listed in a failure message
SHOWN_DIFFERENCES = 8  # payload differences listed per job
VALUE_CHARS = 160      # a value in a message is cut to this many characters


class _Any:
    def __repr__(self) -> str:
        return "ANY"


ANY: Any = _Any()
"""The default of ``payload=``: any payload (None is a payload, so it cannot mean that)."""


def enqueued_jobs(app: Any, task: Any = None, *, queue: str | None = None,
                  state: "str | Iterable[str] | None" = None, limit: int = ROWS_LIMIT) -> list:
    """The jobs in ``app``'s schema, oldest first, as :class:`~pgworker.testing.rows.JobRow`.

    ``task``: a name or a :class:`pgworker.Task` (None: any). ``queue``: a queue name
    (None: any). ``state``: 'pending', 'running', 'succeeded', 'dead', 'cancelled', a
    list of them, or None (default: any state). The filters apply in SQL. ``limit``:
    the most jobs to return (default 10,000). Raises :class:`TooManyJobs` (an
    ``AssertionError``) when more than ``limit`` jobs match, rather than return some of
    them; ``ValueError`` for an unknown state or a bad limit.
    """
    states = check_states(state)
    if queue is not None:
        check_queue_name(queue)
    limit = check_limit(limit)
    with app.connection() as conn:
        read = read_jobs(app.store, conn, task=task_name(task), queue=queue, states=states, limit=limit)
    if read.truncated:
        what = _filters(task_name(task), queue, states)
        raise TooManyJobs(f"more than {limit:,} jobs{what} are in schema {app.settings.schema!r}, and enqueued_jobs "
                          f"returns all or none: narrow it with task=, queue= or state= (they filter in SQL), "
                          f"or pass a larger limit=")
    return read.rows


def assert_enqueued(app: Any, task: Any, payload: Any = ANY, *, payload_contains: dict | None = None,
                    queue: str | None = None, state: "str | Iterable[str] | None" = "pending",
                    count: int | None = None, limit: int = ROWS_LIMIT) -> list[JobRow]:
    """Assert that jobs of ``task`` matching the filters are in ``app``'s schema.

    ``task``: a name or a :class:`pgworker.Task` (None: any task). ``payload``: the exact
    payload, compared as JSON (a tuple equals a list, ``True`` is not ``1``; default any).
    ``payload_contains``: a dict whose keys must be in the payload with these values (nested
    dicts are matched the same way, lists and other values exactly). ``queue``: None for
    any. ``state``: 'pending' (default), another state, a list of states, or None for any.
    ``count``: None means at least one match; a number means exactly that many.
    ``limit``: the most candidate jobs read (default 10,000): the filters apply in SQL
    and the newest candidates are read first.

    Returns the matching jobs, oldest first (with ``count=None`` and more than ``limit``
    candidates, the matches among the newest ``limit``). Raises ``AssertionError``
    listing what was enqueued instead and how each job of the task differs, saying so
    when the read was cut at ``limit`` (an exact ``count`` cannot be checked then);
    ``ValueError`` or ``TypeError`` for bad arguments.
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this helper's source
    match = _Matcher(task, payload, payload_contains, queue, state)
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise ValueError(f"count must be an integer >= 0 (exactly that many jobs), or None (at least one), got {count!r}")
    limit = check_limit(limit)
    with app.connection() as conn:
        read = match.candidates(app, conn, limit)
        found = [j for j in read.rows if match.matches(j)]
        if count is None and found:
            return found
        if count is not None and len(found) == count and not read.truncated:
            return found
        cut = f" The read was cut: {_cut(read, match)}" if read.truncated else ""
        if count is None:
            head = f"expected a {match.describe()}, found none.{cut}"
        else:
            seen = f"at least {len(found)}" if read.truncated else f"{len(found)}"
            head = f"expected exactly {count} job(s) matching [{match.describe()}], found {seen}.{cut}"
        raise AssertionError(head + "\n" + _explain(app, conn, match, limit))


def refute_enqueued(app: Any, task: Any, payload: Any = ANY, *, payload_contains: dict | None = None,
                    queue: str | None = None, state: "str | Iterable[str] | None" = "pending",
                    limit: int = ROWS_LIMIT) -> None:
    """Assert that no job matches (arguments as for :func:`assert_enqueued`).

    Raises ``AssertionError`` listing the jobs that match, and :class:`TooManyJobs` (an
    ``AssertionError``) when more than ``limit`` candidates passed the SQL filters and
    none of those read matched: the older ones were not looked at, so it cannot pass.
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this helper's source
    match = _Matcher(task, payload, payload_contains, queue, state)
    limit = check_limit(limit)
    with app.connection() as conn:
        read = match.candidates(app, conn, limit)
    found = [j for j in read.rows if match.matches(j)]
    if found:
        listed = "\n".join(f"  {_job_line(j)}" for j in found[:SHOWN_JOBS])
        more = f"\n  ... and {len(found) - SHOWN_JOBS} more" if len(found) > SHOWN_JOBS else ""
        seen = f"at least {len(found)}" if read.truncated else f"{len(found)}"
        raise AssertionError(f"expected no {match.describe()}, found {seen}:\n{listed}{more}")
    if read.truncated:
        raise TooManyJobs(f"cannot refute a {match.describe()}: none of the jobs read matched, but {_cut(read, match)}")


class TooManyJobs(AssertionError):
    """A test helper's read hit its ``limit``: more jobs passed its filters than it reads,
    so it cannot answer (the message says how many were read and how to narrow it)."""


_NARROW = ("narrow it with task=, queue=, state=, payload= or payload_contains= (they filter in SQL), "
           "or pass a larger limit=")


def _filters(task: str | None, queue: str | None, states: list[str] | None) -> str:
    """' of task 'x' in queue 'q' in state pending' for the filters given."""
    out = "" if task is None else f" of task {task!r}"
    out += "" if queue is None else f" in queue {queue!r}"
    return out + ("" if states is None else f" in state {' or '.join(states)}")


def _cut(read: JobRead, match: "_Matcher") -> str:
    return (f"only the newest {read.limit:,} candidate jobs (those{_filters(match.task, match.queue, match.states)}"
            f" with the payload filter, as SQL applies it) were read, and older ones exist; {_NARROW}.")


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

    def candidates(self, app: Any, conn: Any, limit: int) -> JobRead:
        """The newest ``limit`` jobs that pass every filter in SQL (a superset of the
        matches: jsonb containment is looser for arrays, so check each with :meth:`matches`)."""
        return read_jobs(app.store, conn, task=self.task, queue=self.queue, states=self.states,
                         payload=self.payload, exact_payload=self.exact, payload_contains=self.contains, limit=limit)

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


def _explain(app: Any, conn: Any, match: _Matcher, limit: int) -> str:
    """What was enqueued: the task's newest jobs with their mismatches, then the other
    jobs among the schema's newest ``limit`` by task and state."""
    mine = read_jobs(app.store, conn, task=match.task, limit=limit)  # any state, queue, payload
    counts, older = count_jobs(app.store, conn, limit=limit)
    if not mine.rows and not counts:  # a misspelt task name is as likely here as with other jobs about
        return f"No job at all is in schema {app.settings.schema!r}" + _registration_hint(app, match.task) + "."
    lines = []
    if not mine.rows:
        lines.append(f"No job of task {match.task!r} is in schema {app.settings.schema!r}"
                     + _registration_hint(app, match.task) + ".")
    else:
        what = "Jobs" if match.task is None else f"Jobs of task {match.task!r}"
        n = f"more than {limit:,}" if mine.truncated else f"{len(mine.rows)}"
        shown = mine.rows[-SHOWN_JOBS:]  # the newest, oldest first
        newest = f", the newest {len(shown)} shown" if len(shown) < len(mine.rows) or mine.truncated else ""
        lines.append(f"{what} ({n}, any state or queue{newest}):")
        for j in shown:
            why = match.mismatches(j)
            lines.append(f"  {_job_line(j)}" + ("  <- matches" if not why else ""))
            lines += [f"      {reason}" for reason in why[:SHOWN_DIFFERENCES]]
            if len(why) > SHOWN_DIFFERENCES:
                lines.append(f"      ... and {len(why) - SHOWN_DIFFERENCES} more differences")
        if len(shown) < len(mine.rows):
            lines.append(f"  ... and {len(mine.rows) - len(shown)}{' or more' if mine.truncated else ''} older")
    others = {k: v for k, v in counts.items() if match.task is not None and k[0] != match.task}
    if others:
        by_task: dict[str, list[str]] = {}
        for (task, state), n in sorted(others.items()):
            by_task.setdefault(task, []).append(f"{state} {n}")
        where = f" among the newest {limit:,} (older ones not counted)" if older else ""
        lines.append(f"Other jobs{where}: " + "; ".join(f"{t!r} ({', '.join(s)})" for t, s in by_task.items()) + ".")
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
