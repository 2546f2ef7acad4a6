"""How a bulk enqueue of jobs without keys travels to the server: the parameters of
``jobs_insert_batch`` (sql/queries/enqueue.sql) and the text of the COPY that large
batches take.

Why a module of its own: in a batch the client's cost per job dominated the call
(measured in issue 23: psycopg formatting eight arrays element by element in Python,
building a tuple and a COPY row per job), so every per-job step here is a C loop
(``map``, ``str.join``, ``itemgetter``, one f-string per row), and what jobs share
is sent once per distinct combination, a *shape*.

Rows are :class:`pgworker.jobspec.PreparedJob` tuples (queue, task, payload as JSON
text, priority, run_at or None, delay in seconds, max_attempts, ...), read by position
so that this module needs nothing above the store.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from operator import itemgetter
from typing import Any, Sequence

from ..errors import InvalidJob

# A job's options that a batch sends once per distinct combination (a "shape"): queue,
# task, priority, run_at, delay_seconds, max_attempts (PreparedJob's fields 0, 1, 3-6).
_SHAPE = itemgetter(0, 1, 3, 4, 5, 6)
_PAYLOAD = itemgetter(2)
#: The separator between payloads in jobs_insert_batch's one text: JSON escapes every
#: control character, so no JSON text holds it.
SEPARATOR = "\x1e"

#: The COPY's columns, in the order :func:`copy_text` writes them (the payload last, so
#: that a row is its id, its shape's text and its payload).
COPY_COLUMNS = ("id", "queue", "task", "priority", "run_at", "max_attempts", "trace_context", "payload")

Shape = tuple[Any, ...]


def shapes(jobs: Sequence[Sequence[Any]]) -> tuple[list[Shape], list[int] | None, dict[str, int]]:
    """(the distinct shapes in order of first use, each job's 1-based shape number or None
    when there is one shape, {queue: jobs})."""
    keys = list(map(_SHAPE, jobs))
    first = keys[0]
    if keys.count(first) == len(keys):  # the common case: one shape
        return [first], None, {first[0]: len(keys)}
    numbers: dict[Shape, int] = {}
    of = [numbers.setdefault(k, len(numbers) + 1) for k in keys]
    found = list(numbers)
    counts: dict[str, int] = {}
    for number, n in Counter(of).items():
        queue = found[number - 1][0]
        counts[queue] = counts.get(queue, 0) + n
    return found, of, counts


def joined_payloads(jobs: Sequence[Sequence[Any]]) -> str:
    """The payloads' JSON texts joined by :data:`SEPARATOR`; raises :class:`InvalidJob`
    (before any I/O) when one holds the separator, which no JSON text does."""
    text = SEPARATOR.join(map(_PAYLOAD, jobs))
    if text.count(SEPARATOR) != len(jobs) - 1:
        raise InvalidJob("a payload holds a raw U+001E control character, which is not JSON text; "
                         "build payloads with pgworker.jobspec.serialize_payload")
    return text


def statement_params(jobs: Sequence[Sequence[Any]]) -> tuple[dict[str, Any], dict[str, int]]:
    """jobs_insert_batch's parameters for ``jobs`` (but the trace context, sequence and
    channel), and {queue: jobs}."""
    found, of, counts = shapes(jobs)
    queues, tasks, priorities, run_ats, delays, max_attempts = (list(c) for c in zip(*found))
    return {"payloads": joined_payloads(jobs), "shape_of": None if of is None else ",".join(map(str, of)),
            "queues": queues, "tasks": tasks, "priorities": priorities, "run_ats": run_ats,
            "delays": delays, "max_attempts": max_attempts}, counts


def _field(value: Any) -> str:
    """One value in COPY's text format (PostgreSQL docs, COPY, "Text Format")."""
    if value is None:
        return "\\N"
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    if "\\" in text or "\t" in text or "\n" in text or "\r" in text:
        text = text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return text


def copy_text(ids: Sequence[int], jobs: Sequence[Sequence[Any]], db_now: datetime,
              trace_context: str | None) -> tuple[str, dict[str, int], set[str]]:
    """The COPY data (text format, :data:`COPY_COLUMNS`) of ``jobs`` with ``ids``, their
    run_at from the database clock ``db_now`` as single enqueues take it; and ({queue:
    jobs}, the queues with a job due now, which get a NOTIFY)."""
    found, of, counts = shapes(jobs)
    texts, due = [], set()
    for queue, task, priority, run_at, delay, max_attempts in found:
        at = run_at or (db_now + timedelta(seconds=delay) if delay else db_now)
        if at <= db_now:
            due.add(queue)
        texts.append("\t".join(map(_field, (queue, task, priority, at, max_attempts, trace_context))))
    payloads = joined_payloads(jobs)
    if "\\" in payloads or "\t" in payloads or "\n" in payloads or "\r" in payloads:
        payloads = _field(payloads)  # JSON escapes in strings: their backslashes doubled
    split = payloads.split(SEPARATOR)
    if of is None:
        mid = texts[0]
        data = "".join([f"{i}\t{mid}\t{p}\n" for i, p in zip(ids, split)])
    else:
        data = "".join([f"{i}\t{texts[n - 1]}\t{p}\n" for i, n, p in zip(ids, of, split)])
    return data, counts, due
