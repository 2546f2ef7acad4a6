"""An attempt's outcome: what will be written for it, validated and bounded where it is decided.

Values that reach the database come from user code (a handler's ``Retry(after=...)`` or
``Snooze(...)``, a custom classifier's code and message). Each is checked here, before
it is recorded, so a value PostgreSQL would refuse (an interval or timestamp out of
range, a NUL byte, a code too long for a metric label) never reaches the batched write:
delays are finite and within ``MAX_DELAY_SECONDS``, codes are short printable text,
messages bounded, printable and free of secrets. A problem is logged once per outcome
with the job id and the fix.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, NamedTuple, Sequence

import psycopg

from ..db import milliseconds
from ..jobs import MAX_DELAY_SECONDS, RESULT_LOST, ClaimedJob, FailRequest, FenceReport, Lease
from ..names import bounded_text
from ..store import Store

log = logging.getLogger("pgworker.claimer")

# What will be written (the slot table records these numbers for the supervisor).
COMPLETE, FAIL, SNOOZE, CANCEL, RELEASE = 1, 2, 3, 4, 5
# The success was committed by the handler's own transaction (ctx.transaction()): nothing
# is written, every runner counts it as succeeded (pgworker/effects/transaction.py).
COMMITTED = 6
KIND_NAMES = {COMPLETE: "complete", FAIL: "fail", SNOOZE: "snooze", CANCEL: "cancel", RELEASE: "release",
              COMMITTED: "committed"}
# The metric outcome each kind counts as once written (a failure: retried or dead, as
# the statement decided; any kind but complete: cancelled when a cancellation was requested).
PROVISIONAL = {COMPLETE: "succeeded", COMMITTED: "succeeded", FAIL: "retried", SNOOZE: "snoozed",
               CANCEL: "cancelled", RELEASE: "released"}

CODE_MAX_CHARS = 64
OUTCOME_INVALID = "OUTCOME_INVALID"
#: The code of an attempt stopped past its timeout or max runtime: by the executor (an
#: async handler cancelled), or by the supervisor (a sync handler's claimer killed)
TIMEOUT = "TIMEOUT"


@dataclass(slots=True)
class Outcome:
    """One attempt's decided outcome, waiting for the batched, fenced write.

    ``slot`` is the job's index in the claimer's slot table; ``run_seconds`` the
    handler's run time (None when it never ran); ``delay`` seconds before a retry or a
    snooze; ``outcome`` the metric outcome expected before the write decides.
    """

    job: ClaimedJob
    slot: int
    kind: int
    outcome: str
    run_seconds: float | None
    code: str | None = None
    message: str = ""
    delay: float = 0.0
    permanent: bool = False
    span: Any = None
    result: str | None = None  # COMPLETE: the handler's return value as JSON (None: nothing to store)
    traceback: str | None = None  # FAIL: where the handler raised, kept in the error history
    decided_at: float = field(default_factory=time.monotonic)
    retries: int = 0  # writes attempted before (a connection failed, or a statement was refused for now)

    @property
    def kind_name(self) -> str:
        return KIND_NAMES[self.kind]

    def write(self) -> "Write":
        """The fenced write of this outcome (the claimer's completer, the test drain)."""
        return Write(self.job.lease, self.kind, self.job.ordering_key, self.code, self.message, self.delay,
                     self.permanent, self.result, self.traceback)


def bounded_delay(value: Any, job: ClaimedJob, what: str, fallback: float) -> float:
    """``value`` (seconds) as a delay the database can hold.

    Negative values become 0; values past ``MAX_DELAY_SECONDS`` (infinity included)
    become ``MAX_DELAY_SECONDS``; anything that is not a number, or NaN, takes
    ``fallback`` (the task's backoff). Each correction is logged with the job id.
    """
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if math.isnan(seconds):
        _warn(job, f"{what} {value!r} is not a number of seconds; using {fallback:.1f} s instead")
        return fallback
    if seconds < 0:
        _warn(job, f"{what} {value!r} is negative; using 0 s")
        return 0.0
    if seconds > MAX_DELAY_SECONDS:
        _warn(job, f"{what} {value!r} is longer than {MAX_DELAY_SECONDS:.0f} s (100 years); using that")
        return MAX_DELAY_SECONDS
    return seconds


def bounded_code(code: Any, job: ClaimedJob, fallback: str) -> str:
    """``code`` if it is 1 to 64 printable characters (it is stored, and becomes the
    ``error_class`` label of the metrics), else ``fallback`` with a warning."""
    if isinstance(code, str) and 0 < len(code) <= CODE_MAX_CHARS and code.isprintable() and code == code.strip():
        return code
    _warn(job, f"error code {code!r:.80} is not 1-{CODE_MAX_CHARS} printable characters; "
               f"recorded as {fallback!r} (fix the classifier or the exception's pgworker_code)")
    return fallback


def bounded_message(message: Any, max_chars: int) -> str:
    """A message for the error history: text, printable, NUL-free, at most ``max_chars``."""
    if not isinstance(message, str):
        message = repr(message)
    return bounded_text(message, max_chars)


def _warn(job: ClaimedJob, text: str) -> None:
    log.warning("job %s (task %r): %s", job.id, job.task, text,
                extra={"action": "outcome_corrected", "job_id": job.id, "queue": job.queue})


class Write(NamedTuple):
    """One fenced outcome write: the lease, the kind, and the values of a failure,
    retry or snooze. ``ordering_key``: the job's key when known (a claimer knows it);
    None for all of a batch makes the store read the keys first (the supervisor).
    ``result``: a success's result as JSON text, None for none, or
    :data:`pgworker.jobs.RESULT_LOST` (see :func:`slot_result`)."""

    lease: Lease
    kind: int
    ordering_key: str | None = None
    code: str | None = None
    message: str = ""
    delay: float = 0.0
    permanent: bool = False
    result: Any = None
    traceback: str | None = None  # FAIL: where the handler raised (executor.stored_traceback)


# How a success's result is kept in its slot (the slot's code field says which; the
# message field holds the JSON), so that the settler can write it for a claimer that died
# after deciding: a result that fits in the slot's message is kept whole, a larger one is
# known only to the dead process and is written as lost (docs/results.md).
RESULT_IN_SLOT = "RESULT"
RESULT_NOT_IN_SLOT = "RESULT_LOST"


def slot_result(code: str, message: str) -> Any:
    """A COMPLETE slot's result for the settler: its JSON, RESULT_LOST, or None (none)."""
    if code == RESULT_IN_SLOT:
        return message
    if code == RESULT_NOT_IN_SLOT:
        return RESULT_LOST
    return None


class WriteBounds(NamedTuple):
    """How long each statement of an outcome write may wait for a lock (``lock_seconds``)
    and run (``statement_seconds``), set for its transaction only: the lease contract's
    rule 5 (:func:`pgworker.worker.lease.outcome_bounds` computes them)."""

    lock_seconds: float
    statement_seconds: float


#: The SQLSTATEs of a statement stopped by its bounds: lock_not_available (lock_timeout)
#: and query_canceled (statement_timeout). Such a write is tried again after a renewal.
TIMEOUT_SQLSTATES = ("55P03", "57014")


@contextlib.contextmanager
def bounded(conn: psycopg.Connection, bounds: WriteBounds | None) -> Iterator[None]:
    """A transaction whose statements wait and run at most ``bounds`` (SET LOCAL: the
    session's own timeouts apply again after it, and a transaction pooler keeps them
    for the transaction); no transaction of its own when ``bounds`` is None."""
    if bounds is None:
        yield
        return
    with conn.transaction():
        conn.execute("SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true)",
                     [milliseconds(bounds.lock_seconds), milliseconds(bounds.statement_seconds)])
        yield


def write_outcomes(store: Store, conn: psycopg.Connection, writes: Sequence[Write], *,
                   keys_known: bool = True, bounds: WriteBounds | None = None) -> dict[int, FenceReport]:
    """Write outcomes: one fenced statement per kind (pgworker/sql/queries/lease.sql);
    ``COMMITTED`` outcomes were written by the handler's transaction and are reported
    accepted without a statement.

    ``bounds``: each kind is written in a transaction of its own whose statements wait
    and run at most that long (the claimer's writes: the renewer skips the rows they
    hold, so they must not hold them past a renewal pass; see :func:`bounded`). A write
    stopped by them raises the psycopg error (SQLSTATE in :data:`TIMEOUT_SQLSTATES`).

    Returns a :class:`pgworker.jobs.FenceReport` per kind: which leases took effect (with
    the state each job went to) and which the fence refused. Raises psycopg errors as
    they come: the caller tells a lost connection from a refused statement.
    """
    groups: dict[int, list[Write]] = {}
    for w in writes:
        groups.setdefault(w.kind, []).append(w)
    out: dict[int, FenceReport] = {}
    for kind, items in groups.items():
        with bounded(conn, None if kind == COMMITTED else bounds):
            out[kind] = _write_kind(store, conn, kind, items, keys_known)
    return out


def _write_kind(store: Store, conn: psycopg.Connection, kind: int, items: Sequence[Write],
                keys_known: bool) -> FenceReport:
    leases = [w.lease for w in items]
    keys = [w.ordering_key for w in items] if keys_known else None
    if kind == COMPLETE:
        return store.complete(conn, leases, keys, [w.result for w in items])
    if kind == FAIL:
        return store.fail(conn, [FailRequest(w.lease, w.code or "ERROR", w.message, w.delay, w.permanent,
                                             w.traceback) for w in items], keys)
    if kind == SNOOZE:
        return store.snooze(conn, leases, [w.delay for w in items], keys)
    if kind == CANCEL:
        return store.finish_cancelled(conn, leases, keys)
    if kind == RELEASE:
        return store.release(conn, leases, keys)
    if kind == COMMITTED:  # already written, in the handler's transaction: no second outcome
        return FenceReport("complete", tuple(le.job_id for le in leases), (),
                           {le.job_id: "succeeded" for le in leases})
    raise ValueError(f"unknown outcome kind {kind}")


def written_outcome(kind: int, state: Any) -> str:
    """The metric outcome of an accepted write, from the state the job went to."""
    if state == "cancelled":
        return "cancelled"
    if kind == FAIL:
        return "dead" if state == "dead" else "retried"
    return PROVISIONAL[kind]


def already_written(store: Store, conn: psycopg.Connection, refused: Sequence[Write]) -> set[int]:
    """The ids of ``refused`` writes that are already recorded: the one rule, for the
    completer and the settler, of "did my write already commit?".

    A write the fence refused may be our own earlier write that committed before its
    reply was lost (a connection dropped mid-write, a claimer killed after its write): the
    row then holds the same fencing token, in the state (and with the error code) this
    write puts it in. Only that proves it: a job that merely left 'running' may have been
    reaped (``LEASE_EXPIRED``), cancelled, or succeeded in the handler's own transaction,
    and counting the write as done then would count an outcome that was not ours. The
    reaper never writes the codes checked here.
    """
    rows = {r[0]: r for r in store.lease_states(conn, [w.lease.job_id for w in refused])}
    done = set()
    for w in refused:
        r = rows.get(w.lease.job_id)
        if r is not None and r[2] == w.lease.token and _shows(w, r[1], r[3]):
            done.add(w.lease.job_id)
    return done


def _shows(w: Write, state: str, code: str | None) -> bool:
    """Whether a row in ``state`` with error ``code`` is what write ``w`` would have made."""
    if w.kind in (COMPLETE, COMMITTED):
        return state == "succeeded"
    if state == "cancelled" and code == "CANCELLED":  # any other kind, when a cancellation was requested
        return True
    if w.kind == FAIL:
        return state in ("pending", "dead") and code == (w.code or "ERROR")
    return w.kind in (RELEASE, SNOOZE) and state == "pending" and code != "LEASE_EXPIRED"
