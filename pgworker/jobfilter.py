"""The console's job filter: which jobs a list shows and a bulk operation changes.

One definition in SQL reads it (``console_job_filter`` in the schema, migration
0006_console.sql); this module turns what an operator typed into its normalised JSON,
refusing what it cannot use with a message that names the fix. The keys: ``queue``,
``state``, ``task``, ``ordering_key``, ``dedupe_key``, ``error_code`` (exact matches),
``created_after`` / ``created_before`` (ISO 8601 UTC), ``payload`` (a JSON object the
payload must contain, PostgreSQL's ``@>``), ``graph`` (a graph id: the jobs linked by
``depends_on``, docs/graphs.md; migration 0014).
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, fields
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping

from .errors import ConfigError
from .jobs import JobState
from .names import check_id, check_key, check_queue_name, check_task_name, parse_id

STATES = tuple(s.value for s in JobState)
#: The largest payload filter accepted (characters of its JSON).
PAYLOAD_FILTER_MAX_CHARS = 4096
_AGO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class FilterError(ConfigError):
    """A filter value the console cannot use; the message names the field and the fix."""


@dataclass(frozen=True)
class JobFilter:
    """A normalised filter; every field None means "any"."""

    queue: str | None = None
    state: str | None = None
    task: str | None = None
    ordering_key: str | None = None
    dedupe_key: str | None = None
    error_code: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    payload: dict[str, Any] | None = None
    graph: int | None = None

    @classmethod
    def parse(cls, params: Mapping[str, Any], *, now: datetime | None = None) -> "JobFilter":
        """From text fields (a query string's): empty values are absent. ``payload`` is a
        JSON object (``{"user_id": 42}``) or ``key=value`` (a dotted key nests:
        ``order.id=7``; the value is read as JSON when it parses, else as text).
        ``created_after``/``created_before`` take ISO 8601 (UTC unless an offset is given)
        or an age such as ``15m`` or ``2d`` (that long ago). ``graph`` is a graph id
        (plain digits). Raises :class:`FilterError`."""
        def text(name: str) -> str | None:
            value = params.get(name)
            if value is None or (isinstance(value, str) and not value.strip()):
                return None
            return value if not isinstance(value, str) else value.strip()

        state = text("state")
        if state is not None and state not in STATES:
            raise FilterError(f"state {state!r} is not a job state; use one of {', '.join(STATES)}")
        now = now or datetime.now(timezone.utc)
        return cls(
            queue=_checked(check_queue_name, text("queue")), state=state,
            task=_checked(check_task_name, text("task")),
            ordering_key=_checked(lambda v: check_key("ordering key", v), text("ordering_key")),
            dedupe_key=_checked(lambda v: check_key("dedupe key", v), text("dedupe_key")),
            error_code=_checked(lambda v: check_key("error code", v), text("error_code")),
            created_after=_when("created_after", text("created_after"), now),
            created_before=_when("created_before", text("created_before"), now),
            payload=_payload(params.get("payload")), graph=_graph(text("graph")))

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> "JobFilter":
        """The filter a bulk operation recorded (:meth:`to_json`'s output). Raises
        ValueError for one that is not an object (a row written by hand)."""
        if not isinstance(value, Mapping):
            raise ValueError(f"the recorded filter is not an object: {str(value)[:200]}")
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in value.items() if k in known}
        for k in ("created_after", "created_before"):
            if kw.get(k):
                kw[k] = datetime.fromisoformat(kw[k])
        return cls(**kw)

    def to_json(self) -> dict[str, Any]:
        """The keys ``console_job_filter`` reads, absent ones left out."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            out[f.name] = value.astimezone(timezone.utc).isoformat() if isinstance(value, datetime) else value
        return out

    def query(self) -> dict[str, str]:
        """The filter as query-string fields (for links that keep it)."""
        out = {}
        for k, v in self.to_json().items():
            out[k] = json.dumps(v, separators=(",", ":")) if k == "payload" else str(v)
        return out

    def replace(self, **changes: Any) -> "JobFilter":
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(changes)
        return JobFilter(**data)

    @property
    def empty(self) -> bool:
        return not self.to_json()

    def describe(self) -> str:
        """In words, for a confirmation page and an audit record: 'state dead, task x'."""
        parts = []
        for k, v in self.to_json().items():
            shown = json.dumps(v, separators=(",", ":")) if k == "payload" else v
            parts.append(f"{k.replace('_', ' ')} {shown}")
        return ", ".join(parts) or "every job"


#: The keys a filter reads (a list's query string and a bulk operation's ``filter``).
KEYS = tuple(f.name for f in fields(JobFilter))


def check_keys(given: Mapping[str, Any], known: tuple[str, ...] = KEYS, *, what: str = "filter",
               changes: bool = True) -> None:
    """Refuse a key ``known`` does not hold, naming the closest known one: a misspelt
    key (``tsk``) would otherwise be dropped and a bulk operation widened to every job
    the rest of the filter matches. ``changes``: the request would change something (the
    message then says nothing was); a read's says nothing of changes. Raises
    :class:`FilterError`."""
    unknown = [k for k in given if k not in known]
    if not unknown:
        return
    key = str(unknown[0])
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise FilterError(f"{what} key {key!r} is not one pgworker reads ({hint}the keys: {', '.join(known)})"
                      + ("; nothing was changed" if changes else ""))


#: How many of the newest jobs a list that matched nothing reads for the names meant.
RECENT_NAMES_JOBS = 1000


def recent_known_names(app: Any, conn: Any) -> tuple[list[str], list[str]]:
    """(queues, tasks) a filter's typo is compared with: the distinct names among the
    newest RECENT_NAMES_JOBS jobs (no index leads with the task: a bounded read of the
    primary key instead of every row), the tasks with the App's own registered ones."""
    queues, tasks = app.store.recent_names(conn, limit=RECENT_NAMES_JOBS)
    return queues, [*tasks, *app.tasks]


def closest_name(given: str, known: Any) -> str | None:
    """The name of ``known`` closest to ``given`` (a typo: ``emials`` for ``emails``;
    difflib's ratio at least 0.6), or None: also when ``given`` is one of them (a real
    name whose jobs the other filters excluded: nothing to guess)."""
    names = sorted(set(known))
    if given in names:
        return None
    close = difflib.get_close_matches(given, names, n=1, cutoff=0.6)
    return close[0] if close else None


def _checked(check: Any, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return check(value)
    except ValueError as exc:
        raise FilterError(str(exc)) from None


def _graph(value: Any) -> int | None:
    """A graph id: digits as text (a query string, a form), or an int (Python, a recorded filter)."""
    if value is None:
        return None
    try:
        return check_id(value, "graph id") if isinstance(value, int) else parse_id(str(value), "graph id")
    except (TypeError, ValueError) as exc:
        raise FilterError(f"{exc}; a graph id is the graph_id of its jobs (a job's page shows it)") from None


def _when(name: str, value: str | None, now: datetime) -> datetime | None:
    if value is None:
        return None
    m = _AGO.match(value)
    if m:
        return now - timedelta(seconds=float(m.group(1)) * _UNIT_SECONDS[m.group(2)])
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise FilterError(f"{name.replace('_', ' ')} {value!r} is neither a time (2026-12-01T09:30, UTC unless "
                          "an offset is given) nor an age (15m, 2h, 7d: that long ago)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _payload(value: Any) -> dict[str, Any] | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, dict):
        return value
    text = str(value).strip()
    if len(text) > PAYLOAD_FILTER_MAX_CHARS:
        raise FilterError(f"the payload filter is {len(text):,} characters long; the limit is "
                          f"{PAYLOAD_FILTER_MAX_CHARS:,}: filter on fewer fields")
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise FilterError(f"the payload filter is not valid JSON ({exc}); "
                              'write an object such as {"user_id": 42}, or user_id=42') from None
        if not isinstance(parsed, dict):
            raise FilterError('the payload filter must be a JSON object, such as {"user_id": 42}')
        return parsed
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise FilterError(f"the payload filter {text!r} is neither a JSON object nor key=value; "
                          'write {"user_id": 42} or user_id=42 (order.id=7 looks inside "order")')
    try:
        leaf: Any = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        leaf = raw.strip()
    for part in reversed(key.strip().split(".")):
        if not part:
            raise FilterError(f"the payload filter's key {key!r} has an empty part; write order.id=7")
        leaf = {part: leaf}
    return leaf
