"""Bulk operations: replay, cancel or discard every job a filter matches, with no cap.

An operation is a row (``bulk_operations``: kind, filter, who asked and, for a cancel or
a discard, why (``reason``), the newest job id at that moment, a cursor) applied in
batches by :func:`apply_batch`, each one transaction that locks the operation's row,
reads the next ``batch_size`` jobs by id after the cursor, changes the matching ones
through the same store methods as the CLI (so the same fences, ordering-key locks and
audit entries: ``job_events`` names the actor and the operation, and keeps the
operation's reason as a single job's cancel keeps its own), records each changed job in
``bulk_operation_jobs`` and moves the cursor. The cursor and the changes commit
together: a process killed mid-batch loses the whole batch, which the next applier does
again; none is done twice (and the primary key of ``bulk_operation_jobs`` would refuse
it). Cancelling waits for the batch in flight (the row lock) and the operation stops
before the next one.

Who applies: the console process (:mod:`pgworker.web.applier`), every replica at once
(``SKIP LOCKED`` shares the operations out). Workers do not: their least-privilege role
may not write the audit trail, and a replay is an operator's act.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import psycopg

from .errors import ConfigError
from .jobfilter import JobFilter
from .names import bounded_text, checked_cancel_reason

if TYPE_CHECKING:
    from .app import App
    from .store import Store

KINDS = ("replay", "cancel", "discard")
#: The states each kind changes; a job matching the filter in another state is passed over.
APPLIES_TO = {"replay": ("dead",), "discard": ("dead",), "cancel": ("pending", "running")}
#: The kinds that keep an operator's reason (a single job's replay keeps none either).
REASON_KINDS = ("cancel", "discard")
#: Jobs read per batch (one transaction); a cancel or discard writes at most this many.
BATCH_SIZE = 500
ERROR_MAX_CHARS = 500
# SQLSTATEs after which the batch is tried again later (it rolled back whole): a lock or
# statement timeout, a deadlock, a serialization failure, the server going away.
_TRANSIENT = ("40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03")


def create(app: "App", kind: str, job_filter: JobFilter, *, actor: str, expected: int | None = None,
           batch_size: int = BATCH_SIZE, reason: str | None = None) -> dict[str, Any]:
    """Record an operation; returns its row (``id``, ``max_id``, ``reason``, ...). A replay
    and a discard take dead jobs only (the filter's state is set to dead); a cancel takes
    pending and running ones. ``reason`` (cancel and discard): the operator's words, kept
    on the operation and in the audit entry of every job it changes, as a single job's
    cancel keeps them (blanks mean none). Raises :class:`ConfigError`, nothing recorded,
    for an unknown kind, a filter on a state the kind cannot change, a reason over
    :data:`pgworker.names.CANCEL_REASON_MAX_CHARS` characters (refused as the command line
    and the API refuse a job's), and a reason given to a replay."""
    job_filter = checked_filter(kind, job_filter)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 10_000:
        raise ConfigError(f"batch_size must be 1 to 10,000 jobs, got {batch_size!r}")
    reason = checked_cancel_reason(reason)
    if reason is not None and kind not in REASON_KINDS:
        # a replay records its actor only (as a single job's replay): a reason would be kept nowhere
        raise ConfigError(f"a bulk {kind} keeps no reason (a reason is kept by cancel and discard only; the "
                          "audit trail names who asked and the operation): leave it out; nothing was changed")
    with app.connection() as c:
        return app.store.bulk_operation_create(c, kind=kind, job_filter=job_filter.to_json(), actor=actor,
                                               expected=expected, batch_size=batch_size, reason=reason)


def checked_filter(kind: str, job_filter: JobFilter) -> JobFilter:
    """The filter an operation of ``kind`` runs with (dead for a replay or discard)."""
    if kind not in KINDS:
        raise ConfigError(f"bulk operation {kind!r} is not one of {', '.join(KINDS)}")
    states = APPLIES_TO[kind]
    if job_filter.state is not None and job_filter.state not in states:
        raise ConfigError(f"a bulk {kind} changes {' and '.join(states)} jobs; the filter names state "
                          f"{job_filter.state!r}: remove it or choose {' or '.join(states)}")
    return job_filter.replace(state="dead") if states == ("dead",) else job_filter


def cancel(app: "App", operation_id: int, *, actor: str) -> dict[str, Any] | None:
    """Stop a running operation between two batches; None when it was not running."""
    with app.connection() as c:
        return app.store.bulk_operation_cancel(c, operation_id, actor=actor)


def apply_batch(store: "Store", conn: psycopg.Connection) -> dict[str, Any] | None:
    """Apply one batch of the oldest running operation no other applier holds, in one
    transaction on ``conn`` (autocommit); returns the operation's row after it, or None
    when there was nothing to apply. A batch the database refuses for good (a privilege,
    a constraint) marks the operation failed with the reason; a transient failure (lock or
    statement timeout, deadlock, a lost connection) propagates and the batch is tried again."""
    op = None
    try:
        with conn.transaction():
            op = store.bulk_operation_claim(conn)
            if op is None:
                return None
            if not isinstance(op["filter"], dict):  # written by hand: not a filter, or undecodable
                store.bulk_operation_fail(conn, op["id"], bounded_text(
                    f"its recorded filter cannot be read: {op['filter']!r}", ERROR_MAX_CHARS))
                return store.bulk_operation_get(conn, op["id"])
            rows = store.bulk_operation_candidates(conn, job_filter=op["filter"], after=op["cursor_id"],
                                                   max_id=op["max_id"], limit=op["batch_size"])
            states = APPLIES_TO[op["kind"]]
            targets = [job_id for job_id, state, matches in rows if matches and state in states]
            changed = _apply(store, conn, op["kind"], targets, actor=audit_actor(op), reason=op["reason"])
            cursor = rows[-1][0] if rows else op["max_id"]
            finished = len(rows) < op["batch_size"] or cursor >= op["max_id"]
            return store.bulk_operation_advance(conn, operation_id=op["id"], cursor=cursor, examined=len(rows),
                                                applied_ids=changed, finished=finished)
    except psycopg.Error as exc:
        if op is None or conn.broken or conn.closed or getattr(exc, "sqlstate", None) in _TRANSIENT:
            raise
        op_id = op["id"]
        store.bulk_operation_fail(conn, op_id, bounded_text(
            f"{type(exc).__name__}: {' '.join(str(exc).split())}", ERROR_MAX_CHARS))
        return store.bulk_operation_get(conn, op_id)


def audit_actor(op: dict[str, Any]) -> str:
    """Who the audit trail names for a change an operation made: its actor and its id."""
    return f"{op['actor']} (bulk operation {op['id']})"


def _apply(store: "Store", conn: psycopg.Connection, kind: str, ids: Sequence[int], *, actor: str,
           reason: str | None) -> list[int]:
    """The jobs of ``ids`` that ``kind`` changed, through the CLI's store methods; a cancel's
    or a discard's ``reason`` (bounded when the operation was recorded) lands in each
    job's audit entry as a single job's does (``{"reason": ...}``)."""
    if not ids:
        return []
    if kind == "replay":
        return sorted(store.replay(conn, ids=ids, actor=actor, limit=len(ids)))
    changed = []
    for job_id in ids:  # cancel/discard: one fenced statement per job, its key locked first
        if store.cancel(conn, job_id, actor=actor, reason=reason) is not None:
            changed.append(job_id)
    return changed
