"""A job as the caller describes it (:class:`JobSpec`), checked and encoded into the row to
insert (:class:`PreparedJob`) before any I/O: names, payload JSON and size, timing,
attempts, keys, and the task it names (:class:`Preparer`, bound to an App's registry).
Shared by the sync and async enqueues, the graph enqueue and the schedules."""

from __future__ import annotations

import difflib
import json
import math
import re
import sys
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, NamedTuple, Optional, Sequence

from .errors import InvalidJob, InvalidName, PayloadError, UnknownTask
from .jobs import EARLIEST_TIMESTAMP, MAX_DELAY_SECONDS
from .names import check_key, check_new_queue_name, check_task_name
from .payloads import to_json_value
from .tasks import (DEFAULT_MAX_ATTEMPTS, ORDERING_ON_DEAD, Task, check_dedupe_window, check_max_attempts,
                    check_ordering_on_dead, check_priority)

# An escaped NUL (an odd number of backslashes before u0000): PostgreSQL's jsonb
# rejects it ("unsupported Unicode escape sequence").
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
#: How deep a payload's JSON may nest. Python's JSON decoder recurses once a level, within
#: the interpreter's recursion limit (1,000) less the frames already on the stack, so a
#: payload the producer could just encode (~990 levels) failed to decode on the worker, a
#: few dozen frames deeper, and ended dead (PAYLOAD_INVALID): refused at enqueue instead.
MAX_PAYLOAD_DEPTH = 500
_NOT_BRACKET_BYTES = bytes(b for b in range(256) if b not in b"[]{}")
# One encoder for every payload: json.dumps with options builds a new one per call.
# ``default``: dataclasses, pydantic models, enums, datetimes... as JSON (pgworker.payloads),
# called only for values JSON has no form for, so plain payloads cost nothing more.
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"), default=to_json_value)


def _c_encoder() -> Any:
    """``_ENCODER``'s C encoder, built once: ``JSONEncoder.encode`` builds a new one (and a
    Python closure) for every payload, about half of a small payload's cost. Its argument
    list is CPython's (json/encoder.py, ``iterencode``); where it differs, or there is no C
    encoder, None and ``_ENCODER.encode`` is used. The markers dict (circular references)
    is its own: after a failed encoding it may hold stale entries, so the encoder is then
    rebuilt (:func:`_encode`)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython without _json
        return None
    try:
        enc = make({}, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False, False)
        sample: Any = {"a": [1, 2.5, None, True, "\u00e9\n"], "b": {}}
        if "".join(enc(sample, 0)) != _ENCODER.encode(sample):  # pragma: no cover - another CPython
            return None
    except TypeError:  # pragma: no cover - another CPython's argument list
        return None
    return enc


_C_ENCODER = _c_encoder()


def _encode(payload: Any) -> str:
    """``_ENCODER.encode(payload)``, through the prebuilt C encoder when there is one."""
    global _C_ENCODER
    enc = _C_ENCODER
    if enc is None:  # pragma: no cover - CPython without _json
        return _ENCODER.encode(payload)
    try:
        return "".join(enc(payload, 0))
    except BaseException:
        _C_ENCODER = _c_encoder()  # its markers may hold this payload's containers
        raise


class JobSpec(NamedTuple):
    """One job for :meth:`pgworker.App.enqueue_many` (same options as ``enqueue``).

    Immutable; a named tuple, so that building thousands of them costs little."""

    task: "str | Task[Any]"
    payload: Any = None
    queue: str | None = None
    priority: int | None = None
    run_at: datetime | None = None
    delay: "float | timedelta | None" = None
    max_attempts: int | None = None
    dedupe_key: str | None = None
    ordering_key: str | None = None
    dedupe_window: "float | timedelta | None" = None
    ordering_on_dead: str | None = None
    #: Dependencies (docs/graphs.md): the jobs this one waits for, each an existing job's id
    #: or, in ``enqueue_many``, the ``ref`` of an earlier job of the same call.
    depends_on: "Sequence[int | str] | None" = None
    #: A name other jobs of the same ``enqueue_many`` call use in their ``depends_on``.
    ref: str | None = None
    #: What this job does when a parent ends dead: 'hold' (default: wait for the replay) or 'cancel'.
    on_parent_failure: str | None = None
    #: The graph it belongs to (default: its parents' graph; in a call with dependencies, the call's first job).
    graph_id: int | None = None



class PreparedJob(NamedTuple):
    """A validated job with its defaults resolved and its payload as JSON text."""

    queue: str
    task: str
    payload_json: str
    priority: int
    run_at: datetime | None
    delay_seconds: float
    max_attempts: int
    dedupe_key: str | None
    ordering_key: str | None
    dedupe_window_seconds: float | None = None
    dead_blocks_key: bool = True


def serialize_payload(payload: Any, max_bytes: int) -> str:
    """The payload as compact JSON text; raises :class:`PayloadError` naming the fix.

    Dataclass instances, pydantic models, enums, datetimes, UUIDs and Decimals are
    converted (:func:`pgworker.payloads.to_json_value`). Refused: values JSON cannot carry
    (sets, bytes, other objects), NaN and infinities (not
    JSON, RFC 8259 section 6), NUL characters and lone surrogates (PostgreSQL ``jsonb``
    cannot store them), nesting deeper than ``MAX_PAYLOAD_DEPTH`` (500) levels, and payloads
    larger than ``max_bytes`` in UTF-8.
    """
    try:
        text = _encode(payload)
    except TypeError as exc:
        raise PayloadError(f"payload is not JSON-serialisable: {exc}; pass dicts, lists, str, "
                           "int, float, bool or None, dataclasses or pydantic models of them (sets as lists, bytes as base64 text)") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):
            raise PayloadError(f"payload holds an integer of more than {sys.get_int_max_str_digits():,} digits, "
                               "beyond Python's int conversion limit (a worker could not read it back): send it "
                               "as a string") from None
        raise PayloadError(f"payload is not valid JSON: {exc}; replace NaN and infinities "
                           "with null or a string") from None
    except RecursionError:
        raise PayloadError("payload is nested too deeply to serialise; flatten it") from None
    try:
        # ASCII text is its own UTF-8 (and has no lone surrogate): skip the encoding
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise PayloadError("payload contains a lone surrogate character, which is not valid "
                           "UTF-8; fix the string's encoding") from None
    if size > max_bytes:
        raise PayloadError(f"payload is {size} bytes of JSON, over the limit of {max_bytes}; "
                           "store large data elsewhere and enqueue a reference to it "
                           "(or raise PGWORKER_MAX_PAYLOAD_BYTES)")
    depth = json_depth(text, MAX_PAYLOAD_DEPTH) if text.count("[") + text.count("{") > MAX_PAYLOAD_DEPTH else 0
    if depth > MAX_PAYLOAD_DEPTH:
        raise PayloadError(f"payload nests more than {MAX_PAYLOAD_DEPTH} levels deep, the limit that a "
                           "worker can decode; flatten it (a list of records rather than records nested "
                           "in one another)")
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise PayloadError("payload contains a NUL character (\\u0000), which PostgreSQL jsonb "
                           "cannot store; remove it or encode the data as base64")
    return text


def json_depth(text: str, limit: int) -> int:
    """How deep the arrays and objects of valid JSON ``text`` nest (0 for a scalar), or
    ``limit + 1`` as soon as it is known to be deeper than ``limit``. C-speed byte
    operations only (a Python loop over a megabyte of brackets cost 200 ms: a trial): the
    strings go (their escaped backslashes and quotes first, then every other run between
    quotes), then every byte that is not a bracket; then each pass takes one level off
    every innermost pair at once (marked, then dropped, so that '{[]}' loses only '[]'),
    so a wide payload costs a pass or two. UTF-8 never encodes a bracket or a quote
    inside another character."""
    data = text.encode("utf-8")
    if b'"' in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
        data = b"".join(data.split(b'"')[::2])
    brackets = data.translate(None, _NOT_BRACKET_BYTES)
    depth = 0
    while brackets:
        if depth == limit:
            return limit + 1
        brackets = brackets.replace(b"[]", b"x").replace(b"{}", b"x").replace(b"x", b"")
        depth += 1
    return depth


def _delay_seconds(delay: "float | timedelta | None") -> float:
    if delay is None:
        return 0.0
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, (int, float)) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        raise InvalidJob(f"delay must be seconds (a number) or a timedelta, got {type(delay).__name__}")
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_DELAY_SECONDS:
        raise InvalidJob(f"delay must be between 0 and 100 years in seconds, got {delay!r}")
    return seconds


def _check_run_at(run_at: Any) -> datetime | None:
    """``run_at`` as the UTC instant it names (None stays None), or :class:`InvalidJob`.

    Converted to UTC here, once: an aware datetime in the repeated hour of a daylight-saving
    fall-back names one of two instants by its ``fold``, which equality and hashing ignore
    (PEP 495), so anything that compares or remembers run_at values (the Preparer's cache)
    could otherwise confuse the two. A UTC datetime is unambiguous.
    """
    if run_at is None:
        return None
    if not isinstance(run_at, datetime):
        raise InvalidJob(f"run_at must be a datetime, got {type(run_at).__name__}")
    if run_at.tzinfo is None or run_at.utcoffset() is None:
        raise InvalidJob("run_at has no time zone; pass an aware datetime such as "
                         "datetime.now(timezone.utc) + timedelta(minutes=5), or use delay=seconds")
    # The range delay= has too (0 to 100 years from now), with any past time down to 1970
    # (a past run_at is due now), inside the jobs table's range (jobs_run_at_range, which
    # refuses what no claim could handle). Checked on the worker's clock: only the bounds
    # depend on it, and they are decades wide.
    if run_at < EARLIEST_TIMESTAMP or run_at - datetime.now(timezone.utc) > timedelta(seconds=MAX_DELAY_SECONDS):
        raise InvalidJob(f"run_at {run_at.isoformat()} is out of range: a job can be scheduled from "
                         "1970-01-01 UTC to 100 years from now; pass a run_at in that range (any past "
                         "time means due now), or delay=seconds")
    return run_at.astimezone(timezone.utc)


# A task's payload check (Task.payload_check): raises PayloadError for a payload its worker will refuse.
PayloadCheck = Optional[Callable[[str], None]]

# How many registered names an UnknownTask message lists when none is close to the typo.
_KNOWN_TASKS_SHOWN = 10


def prepare(spec: JobSpec, tasks: dict[str, Task[Any]], max_payload_bytes: int, *,
            any_task: bool = False, check_payload: bool = True) -> PreparedJob:
    """Validate one job and resolve its defaults from the task, if registered here.

    ``tasks``: the App's registered tasks. When there are any, a task given by name must
    be one of them (raises :class:`UnknownTask` naming the closest ones): an App that
    knows its tasks can catch a typo that would otherwise only surface as a dead
    UNKNOWN_TASK job on some worker. ``any_task=True``, or an App with no tasks (a pure
    producer), enqueues any name: the job then takes the queue 'default' unless one is
    given, and 5 attempts.

    A task known here (registered, or given as a Task) has its payload checked as the
    worker will decode it (:attr:`Task.payload_check`; raises :class:`PayloadError`), unless
    ``check_payload=False`` (the :class:`Preparer` checks each payload itself).
    """
    task = spec.task
    registered: Task[Any] | None = task if isinstance(task, Task) else tasks.get(task)
    name = check_task_name(task.name if isinstance(task, Task) else task)
    if registered is None and tasks and not any_task:
        raise UnknownTask(unknown_task_message(name, tasks))
    queue = check_new_queue_name(spec.queue if spec.queue is not None
                             else (registered.queue if registered else "default"))
    priority = check_priority(spec.priority if spec.priority is not None
                              else (registered.priority if registered else 0))
    max_attempts = check_max_attempts(spec.max_attempts if spec.max_attempts is not None
                                      else (registered.max_attempts if registered else DEFAULT_MAX_ATTEMPTS))
    if spec.run_at is not None and spec.delay is not None:
        raise InvalidJob("give run_at or delay, not both")
    run_at = _check_run_at(spec.run_at)
    dedupe_key = check_key("dedupe_key", spec.dedupe_key)
    window = check_dedupe_window(spec.dedupe_window if spec.dedupe_window is not None
                                 else (registered.dedupe_window_seconds if registered else None))
    if spec.dedupe_window is not None and dedupe_key is None:
        raise InvalidJob("dedupe_window needs a dedupe_key: it is how long after success the key "
                         "stays held; pass dedupe_key=... too")
    on_dead = check_ordering_on_dead(spec.ordering_on_dead if spec.ordering_on_dead is not None
                                     else (registered.ordering_on_dead if registered else "block"))
    payload_json = serialize_payload(spec.payload, max_payload_bytes)
    check = registered.payload_check if registered is not None and check_payload else None
    if check is not None:
        check(payload_json)
    return PreparedJob(
        queue=queue, task=name, payload_json=payload_json,
        priority=priority, run_at=run_at, delay_seconds=_delay_seconds(spec.delay),
        max_attempts=max_attempts, dedupe_key=dedupe_key,
        ordering_key=check_key("ordering_key", spec.ordering_key),
        dedupe_window_seconds=window if dedupe_key is not None else None,
        dead_blocks_key=ORDERING_ON_DEAD[on_dead])


class Preparer:
    """:func:`prepare` with memory: the options jobs share (task, queue, priority, timing,
    keys) are validated once per distinct combination and remembered (up to
    ``MAX_REMEMBERED`` combinations; forgotten when the App's tasks change), with the
    task's payload check (:attr:`Task.payload_check`, None for most tasks); each payload
    is encoded and checked on its own. The same checks and errors as :func:`prepare`, at
    a fraction of the cost for the enqueues of a busy producer and for a batch."""

    MAX_REMEMBERED = 1024

    def __init__(self, tasks: dict[str, Task[Any]], max_payload_bytes: int) -> None:
        self.tasks = tasks
        self.max_payload_bytes = max_payload_bytes
        self._shared: dict[tuple[Any, ...], tuple[PreparedJob, PayloadCheck]] = {}
        self._tasks_seen = -1

    def one(self, spec: JobSpec, any_task: bool = False) -> PreparedJob:
        return self._one(spec, any_task)[0]

    def _one(self, spec: JobSpec, any_task: bool) -> tuple[PreparedJob, PayloadCheck]:
        """The prepared job and the payload check of its task (which it passed)."""
        if len(self.tasks) != self._tasks_seen or len(self._shared) >= self.MAX_REMEMBERED:
            self._shared.clear()  # a task registered since (its defaults apply now), or full
            self._tasks_seen = len(self.tasks)
        task = spec.task
        # run_at's fold goes into the key: datetimes that differ only by fold (the two
        # instants of a fall-back's repeated hour) are equal and hash alike (PEP 495), and
        # one would be served the other's prepared instant, an hour off
        key = (task if isinstance(task, str) else id(task), any_task, *spec[2:],
               getattr(spec.run_at, "fold", None))
        if spec.depends_on is not None or spec.ref is not None or spec.on_parent_failure is not None \
                or spec.graph_id is not None:  # pgworker.dependencies reads these; prepare() the rest
            spec = spec._replace(depends_on=None, ref=None, on_parent_failure=None, graph_id=None)
            key = (task if isinstance(task, str) else id(task), any_task, *spec[2:],
                   getattr(spec.run_at, "fold", None))
        try:
            entry = self._shared.get(key)
        except TypeError:  # an unhashable option: validated (and refused) on its own
            return prepare(spec, self.tasks, self.max_payload_bytes, any_task=any_task), _check_of(task, self.tasks)
        if entry is None:
            entry = self._shared[key] = (
                prepare(spec._replace(payload=None), self.tasks, self.max_payload_bytes, any_task=any_task,
                        check_payload=False),
                _check_of(task, self.tasks))
        base, check = entry
        text = serialize_payload(spec.payload, self.max_payload_bytes)
        if check is not None:
            check(text)
        return _with_payload(base, text), check

    def many(self, specs: Iterable[JobSpec], any_task: bool = False) -> list[PreparedJob]:
        """:meth:`one` for each spec, in order. A spec with the same task object and the
        same options as the one before it (the usual batch) reuses that one's prepared
        options and payload check without building and hashing a cache key: only its
        payload is encoded (and checked, when its task has a check). A spec with a
        ``run_at`` always takes :meth:`one`, whose key tells a fall-back's two instants
        apart (equality ignores ``fold``). A spec refused raises its error
        (:class:`PayloadError`, :class:`InvalidJob` or :class:`UnknownTask`,
        :class:`InvalidName`) naming its index (``jobs[3]: ...``): nothing of the batch is
        enqueued."""
        out: list[PreparedJob] = []
        limit = self.max_payload_bytes
        prev_task: Any = None
        prev_options: Any = None
        base: PreparedJob | None = None
        check: PayloadCheck = None
        for spec in specs:
            try:
                options = spec[2:]
                if base is not None and spec[0] is prev_task and spec[4] is None and options == prev_options:
                    text = serialize_payload(spec[1], limit)
                    if check is not None:
                        check(text)
                    out.append(_with_payload(base, text))
                    continue
                base, check = self._one(spec, any_task)
                out.append(base)
                prev_task, prev_options = spec[0], options
            except (PayloadError, InvalidJob, InvalidName) as exc:
                # which of the batch (out holds those before it): the message alone does not say
                raise type(exc)(f"jobs[{len(out)}]: {exc}") from None
        return out


def _check_of(task: "str | Task[Any]", tasks: dict[str, Task[Any]]) -> PayloadCheck:
    """The payload check of ``task`` when it is known here (a Task, or a name registered
    in ``tasks``), else None: a producer that does not know the task checks no more."""
    known = task if isinstance(task, Task) else tasks.get(task)
    return known.payload_check if known is not None else None


_new_tuple = tuple.__new__


def _with_payload(base: PreparedJob, payload_json: str) -> PreparedJob:
    """``base`` with another payload (what ``base._replace(payload_json=...)`` makes, at a
    fraction of its cost: it runs for every job of a batch)."""
    return _new_tuple(PreparedJob, (base[0], base[1], payload_json, *base[3:]))


def unknown_task_message(name: str, tasks: dict[str, Task[Any]]) -> str:
    """Why ``name`` is refused, the registered names closest to it (difflib), and how to
    enqueue it anyway."""
    close = difflib.get_close_matches(name, list(tasks), n=3, cutoff=0.6)
    if close:
        known = "did you mean " + " or ".join(repr(c) for c in close) + "?"
    else:
        names = sorted(tasks)
        more = f" and {len(names) - _KNOWN_TASKS_SHOWN} more" if len(names) > _KNOWN_TASKS_SHOWN else ""
        known = "its tasks: " + ", ".join(repr(n) for n in names[:_KNOWN_TASKS_SHOWN]) + more
    return (f"task {name!r} is not registered on this App ({known}); nothing was enqueued. To enqueue "
            "a task this App does not register (one another service's worker handles), pass "
            "any_task=True (CLI: --any-task)")


def specs_from(items: Iterable[Any]) -> list[JobSpec]:
    """Accept JobSpec objects, dicts of JobSpec fields, or (task, payload) tuples."""
    out = []
    for item in items:
        if isinstance(item, JobSpec):
            out.append(item)
        elif isinstance(item, dict):
            out.append(JobSpec(**item))
        elif isinstance(item, tuple) and len(item) == 2:
            out.append(JobSpec(item[0], item[1]))
        elif isinstance(item, tuple):
            raise InvalidJob(f"enqueue_many takes (task, payload) pairs, got a tuple of {len(item)} items; give "
                             "options as JobSpec(task, payload, delay=...) or a dict of JobSpec's fields")
        else:
            raise InvalidJob(f"enqueue_many takes JobSpec, dict or (task, payload) items, got {type(item).__name__}")
    return out
