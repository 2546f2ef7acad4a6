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
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
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
    def parse_object(cls, value: Any, *, now: datetime | None = None) -> "JobFilter":
        """From a JSON object (a bulk operation's ``filter`` sent to the API): each key of
        :data:`KEYS` at most once, with the type :data:`JSON_TYPES` gives it, none empty
        (null or blank: it would select every job the other keys match); then as
        :meth:`parse`. ``{}`` is every job. Raises :class:`FilterError` naming the key and
        the fix: a list or a boolean was once read as its Python text ("['a', 'b']")."""
        if not isinstance(value, Mapping):
            raise FilterError('filter must be an object such as {"state": "dead", "task": "send_email"} '
                              "({} for every job); nothing was started")
        check_keys(value)  # a misspelt key, dropped, would widen the operation to every job the rest matches
        empty = sorted(k for k, v in value.items() if v is None or (isinstance(v, str) and not v.strip()))
        if empty:
            raise FilterError(f"filter key {', '.join(map(repr, empty))} is empty (null or blank), which would "
                              "select every job the other keys match: give it a value or leave it out; nothing "
                              "was started")
        for key, v in value.items():
            types, shown = JSON_TYPES[key]
            if isinstance(v, bool) or not isinstance(v, types):
                raise FilterError(f"filter key {key!r} takes {shown}, got {_json_kind(v)} "
                                  f"{json.dumps(v, default=str)[:100]}; nothing was started")
        return cls.parse(value, now=now)

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


#: The JSON type each key of a filter object takes (:meth:`JobFilter.parse_object`), in words.
JSON_TYPES: dict[str, tuple[Any, str]] = {
    **{k: (str, "a string") for k in KEYS if k not in ("payload", "graph")},
    "payload": ((dict, str), 'an object the payload contains ({"user_id": 42}) or "key=value"'),
    "graph": ((int, str), "a graph id, an integer (56)"),
}


def _json_kind(value: Any) -> str:
    return ("a boolean" if isinstance(value, bool) else "a list" if isinstance(value, list) else
            "an object" if isinstance(value, dict) else "a number" if isinstance(value, (int, float)) else
            "a string" if isinstance(value, str) else type(value).__name__)


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
    try:
        if m:
            return now - timedelta(seconds=float(m.group(1)) * _UNIT_SECONDS[m.group(2)])
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        # in UTC now: to_json writes it so, and an offset at the ends of the range leaves it
        return moment.astimezone(timezone.utc) if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    except ValueError:
        raise FilterError(f"{name.replace('_', ' ')} {value!r} is neither a time (2026-12-01T09:30, UTC unless "
                          "an offset is given) nor an age (15m, 2h, 7d: that long ago)") from None
    except OverflowError:  # an age beyond year 1 (99999999999h), a time an offset moves out of years 1-9999
        raise FilterError(f"{name.replace('_', ' ')} {value[:40]!r} is out of range: a time is in years 1 to 9999 "
                          "(2026-12-01T09:30), an age reaches back no further than year 1 (15m, 2h, 7d, "
                          "52w)") from None


def _payload(value: Any) -> dict[str, Any] | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, dict):
        return _payload_checked(value, measure=True)  # an object sent as JSON; typed text is measured below
    text = str(value).strip()
    if len(text) > PAYLOAD_FILTER_MAX_CHARS:
        raise FilterError(f"the payload filter is {len(text):,} characters long; the limit is "
                          f"{PAYLOAD_FILTER_MAX_CHARS:,}: filter on fewer fields")
    if text.startswith("{"):
        try:
            parsed = json.loads(text, parse_constant=_no_constant)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise FilterError(f"the payload filter is not valid JSON ({exc}); "
                              'write an object such as {"user_id": 42}, or user_id=42') from None
        if not isinstance(parsed, dict):
            raise FilterError('the payload filter must be a JSON object, such as {"user_id": 42}')
        return _payload_checked(parsed)
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise FilterError(f"the payload filter {text!r} is neither a JSON object nor key=value; "
                          'write {"user_id": 42} or user_id=42 (order.id=7 looks inside "order")')
    try:
        leaf: Any = json.loads(raw, parse_constant=_no_constant)
    except (json.JSONDecodeError, RecursionError):
        leaf = raw.strip()  # a=NaN: the text "NaN"
    for part in reversed(key.strip().split(".")):
        if not part:
            raise FilterError(f"the payload filter's key {key!r} has an empty part; write order.id=7")
        leaf = {part: leaf}
    return _payload_checked(leaf)


def _no_constant(name: str) -> Any:
    """json.loads' reading of NaN, Infinity, -Infinity: JSON has none (nor has jsonb)."""
    raise json.JSONDecodeError(f"{name} is not JSON (write a number, or the text \"{name}\")", name, 0)


def _payload_checked(payload: dict[str, Any], *, measure: bool = False) -> dict[str, Any]:
    """``payload`` if it narrows the list and PostgreSQL's jsonb can hold it, else
    :class:`FilterError` naming what to change: ``{}`` (it matches every job whose payload
    is an object), a non-finite number (NaN, Infinity, 1e400), a NUL character or a lone
    surrogate in a key or a string (PostgreSQL refused them, and the console reported its
    refusal as the server unavailable, 503). ``measure``: an object sent as JSON, held to
    :data:`PAYLOAD_FILTER_MAX_CHARS` as its text without escapes (what was sent: typed text
    is measured as typed, not as the escaped JSON of the object its dotted keys make)."""
    if not payload:
        raise FilterError('the payload filter {} matches every job whose payload is an object: name what it '
                          'contains, such as {"user_id": 42}, or leave it out')
    try:
        text = json.dumps(payload, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except ValueError:
        raise FilterError("the payload filter holds NaN, an infinite number or one beyond a double (1e400), which "
                          'this filter cannot compare: filter on a finite number, or on the text ("NaN")') from None
    except RecursionError:
        raise FilterError("the payload filter is nested too deeply to read: filter on fewer levels") from None
    if measure and len(text) > PAYLOAD_FILTER_MAX_CHARS:
        raise FilterError(f"the payload filter is {len(text):,} characters long; the limit is "
                          f"{PAYLOAD_FILTER_MAX_CHARS:,}: filter on fewer fields")
    stack: list[Any] = [payload]
    while stack:
        item = stack.pop()
        texts = [*item, *item.values()] if isinstance(item, dict) else item if isinstance(item, list) else [item]
        for t in texts:
            if isinstance(t, (dict, list)):
                stack.append(t)
            elif isinstance(t, str) and _UNSTORABLE.search(t):
                raise FilterError(f"the payload filter holds {json.dumps(t)[:60]}: a NUL character (\\u0000) or "
                                  "a lone surrogate, which PostgreSQL's jsonb cannot hold (so no payload has it): "
                                  "remove it")
    return payload
