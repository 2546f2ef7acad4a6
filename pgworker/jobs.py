"""What a job is, as the database and a handler see it."""

from __future__ import annotations

import enum
import json
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NamedTuple, Sequence

# The longest delay pgworker accepts anywhere (enqueue, retry, snooze), in seconds: 100
# years, far inside what a PostgreSQL interval and timestamp can hold (PostgreSQL docs
# 8.5, "Date/Time Types").
MAX_DELAY_SECONDS = 100 * 365 * 86400.0

# The earliest timestamp a job's row may hold (run_at, created_at, lease_expires_at; a
# queue's tokens_at), up to 9999-01-01 UTC: CHECK constraints since migration 0005
# (jobs_run_at_range, ...). Every claim can compute with a value in that range ('-infinity'
# made every claim of its queue fail: "cannot subtract infinite timestamps") and psycopg
# can read it back in any session time zone (a year before 1 or after 9999 in the
# session's zone cannot be a datetime: a claim that committed such a row was lost whole).
# 1970 is far before any real job; 9999 is far past now + MAX_DELAY_SECONDS, the latest an
# enqueue accepts.
EARLIEST_TIMESTAMP = datetime(1970, 1, 1, tzinfo=timezone.utc)


class JobState(str, enum.Enum):
    """The job states (the ``job_state`` enum in the schema).

    pending -> running -> succeeded | pending (retry) | dead; pending | dead -> cancelled;
    dead -> pending (replay).
    """

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"


class Outcome(str, enum.Enum):
    """How one attempt ended, as counted in ``pgworker_jobs_finished_total``."""

    SUCCEEDED = "succeeded"
    RETRIED = "retried"
    DEAD = "dead"
    CANCELLED = "cancelled"
    RELEASED = "released"
    SNOOZED = "snoozed"
    LOST = "lost"


class _ResultLost:
    """The result of a success written without it (see :data:`RESULT_LOST`)."""

    def __repr__(self) -> str:
        return "RESULT_LOST"


#: In the ``results`` of :meth:`pgworker.store.Store.complete`: the job succeeded but what its
#: handler returned is not known any more (its claimer died after deciding the success,
#: and the result was too large for shared memory); stored as SQL NULL in job_results.
RESULT_LOST: Any = _ResultLost()


class Lease(NamedTuple):
    """The right to settle one attempt of a job: its id and the claim's fencing token.

    Immutable (a named tuple: built once per job on the hot path, so built cheaply)."""

    job_id: int
    token: int


class ClaimedJob(NamedTuple):
    """A job returned by a claim, leased to the claimer until ``lease_expires_at``.

    Immutable; a named tuple rather than a frozen dataclass because a claimer builds one
    per job and a frozen dataclass's constructor costs several times more."""

    id: int
    queue: str
    task: str
    payload: Any
    priority: int
    attempt: int
    max_attempts: int
    lease_token: int
    lease_expires_at: datetime
    run_at: datetime
    created_at: datetime
    trace_context: dict[str, Any] | None  # W3C carrier; a dependent's also its parents' (tracing.py)
    ordering_key: str | None
    dedupe_key: str | None
    wait_seconds: float
    # a dependent's first attempt: seconds from unblocked (its last parent succeeded) and
    # due to this claim, database clock; None for other jobs and attempts
    unblock_wait_seconds: float | None = None

    @property
    def lease(self) -> Lease:
        return Lease(self.id, self.lease_token)

    @property
    def idempotency_key(self) -> str:
        """Stable across every attempt (and replay) of this job: use it for side effects."""
        return f"pgw-{self.id}-{int(self.created_at.timestamp() * 1_000_000)}"


@dataclass(frozen=True)
class ClaimResult:
    """What one claim returned: the jobs, and the queue's policy verdict.

    ``paused``: the queue is paused (no jobs). ``limited``: it has a global concurrency or
    rate limit (claims lock its row). ``allowance``: how many jobs the policies allowed
    this claim (the batch size when unlimited). ``retry_after_seconds``: for a rate-limited
    queue whose bucket holds less than one token after this claim while a due job is
    left unclaimed, the seconds until the next token arrives (None otherwise: nothing
    waits for a token).

    For the claimer's floors (:mod:`pgworker.claim_floors`): ``horizon_at``,
    ``horizon_epoch`` and ``horizon_granted``, the claim's horizon for its queue (database
    clock and epoch of the queue's bucket; not granted when writers held the bucket's
    lock, and then ``horizon_at`` is the oldest holder's transaction start, or None when
    it cannot be read: migration 0013), ``aged_count``, how many of ``jobs`` (the first ones) came from the aging arm,
    ``aging_seconds``, the queue's aging bound that claim used (None: none), and
    ``due_until``, the claim's ``now()`` (the end of its due range; database clock).
    """

    jobs: list[ClaimedJob]
    paused: bool = False
    limited: bool = False
    allowance: int = 0
    retry_after_seconds: float | None = None
    horizon_at: datetime | None = None
    horizon_epoch: int | None = None
    horizon_granted: bool = False
    aged_count: int = 0
    aging_seconds: float | None = None
    due_until: datetime | None = None


@dataclass(frozen=True)
class FenceReport:
    """Result of a batched fenced write: which leases took effect, which were refused.

    A refused lease updated zero rows: its fencing token moved on or (for renew and
    complete) its lease expired. The caller must not act as owner of a refused job.
    ``accepted`` and ``refused`` list job ids; ``details`` maps an accepted job id to
    what the statement reported for it (the new state, or a cancellation flag).
    ``skipped`` (the pod's renewals only) lists leases whose rows another session held
    locked: neither renewed nor refused.
    """

    operation: str
    accepted: tuple[int, ...] = ()
    refused: tuple[int, ...] = ()
    details: dict[int, Any] = field(default_factory=dict)
    skipped: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.refused

    @classmethod
    def build(cls, operation: str, leases: Sequence[Lease],
              rows: Sequence[Sequence[Any]], detail_column: int | None = None) -> "FenceReport":
        """From the statement's rows, each starting (job id, lease token, ...)."""
        took = {(r[0], r[1]): (r[detail_column] if detail_column is not None else None) for r in rows}
        accepted = tuple(le.job_id for le in leases if (le.job_id, le.token) in took)
        refused = tuple(le.job_id for le in leases if (le.job_id, le.token) not in took)
        return cls(operation, accepted, refused, {k[0]: v for k, v in took.items()})


@dataclass(frozen=True)
class FailRequest:
    """One failed attempt to record: retry after ``delay_seconds`` unless permanent.
    ``traceback``: where the handler raised (bounded, redacted text), kept in the error
    history entry beside the message; None: none kept."""

    lease: Lease
    code: str
    message: str
    delay_seconds: float
    permanent: bool = False
    traceback: str | None = None


class ReapCandidate(NamedTuple):
    """An expired lease as the reaper found it (``jobs_reap_candidates``)."""

    id: int
    queue: str
    ordering_key: str | None
    task: str
    attempts: int
    lease_expires_at: datetime


@dataclass(frozen=True)
class ReapFailure:
    """An expired lease whose row the reaper could not write, alone in its transaction (a
    CHECK constraint or trigger a user added refused it, a value out of range): the rest of
    its batch was reaped without it."""

    job_id: int
    queue: str
    sqlstate: str
    message: str
    """The server's primary message, bounded (never its DETAIL, which can quote the row)."""
    noted: bool
    """Whether the failure could be written to the job's error history (REAP_FAILED)."""


@dataclass(frozen=True)
class ReapResult:
    """Expired leases recovered by one reap batch, by the state each job went to."""

    requeued: tuple[int, ...] = ()
    dead: tuple[int, ...] = ()
    cancelled: tuple[int, ...] = ()
    by_queue: dict[tuple[str, str], int] = field(default_factory=dict)
    """Counts keyed by (queue, new state)."""
    candidates: int = 0
    """Expired leases found (some may have been settled or reaped by another reaper meanwhile)."""
    skipped: int = 0
    """Expired leases left for a later pass because another transaction held their
    ordering key's lock (maintenance never waits for a lock)."""
    failed: tuple[ReapFailure, ...] = ()
    """Expired leases whose row could not be written (each isolated from its batch)."""
    last: tuple[datetime, int] | None = None
    """(lease expiry, id) of the last candidate found: where the next batch of the same
    pass goes on (``after``), so that candidates left behind never hide the ones after them."""

    @property
    def total(self) -> int:
        return len(self.requeued) + len(self.dead) + len(self.cancelled)


class UndecodablePayload:
    """Stands in for a stored JSON value Python cannot decode: nested deeper than the
    interpreter's recursion limit (PostgreSQL's own limit exceeds it: about 1,000 levels
    against tens of thousands), or an integer of more than 4,300 digits (Python's
    int-to-string conversion limit). pgworker's enqueue refuses both, so only a value
    written into the table by hand, or by a producer that lifted
    ``sys.set_int_max_str_digits`` where the worker did not, can be one. A claimed job's fails with PAYLOAD_INVALID
    instead of every claim of its queue failing; a job read for display (``get_job``, the
    console, ``pgworker jobs show``) shows it as this object's text."""

    def __init__(self, reason: str, size: int) -> None:
        self.reason = reason
        self.size = size

    def __repr__(self) -> str:
        return f"<undecodable JSON of {self.size} bytes: {self.reason}>"


_decode = json.JSONDecoder().decode


def safe_json_loads(data: "str | bytes") -> Any:
    """``json.loads`` that returns :class:`UndecodablePayload` instead of raising, for the
    claim's result rows (psycopg ``set_json_loads`` on the claimer's connection) and the
    App's pooled connections (one hand-written value must not fail a whole page). PostgreSQL
    sends UTF-8 (a jsonb's text is always valid UTF-8), so bytes are decoded directly
    rather than through ``json.loads``' encoding detection."""
    try:
        return _decode(data.decode("utf-8") if isinstance(data, bytes) else data)
    except RecursionError:
        return UndecodablePayload("nested too deeply for Python's JSON decoder", len(data))
    except ValueError as exc:
        if "integer string conversion" in str(exc):  # valid JSON, beyond Python's int limit
            return UndecodablePayload(f"an integer of more than {sys.get_int_max_str_digits():,} digits (Python's "
                                      "int conversion limit, sys.set_int_max_str_digits)", len(data))
        return UndecodablePayload(f"invalid JSON: {exc}", len(data))


#: The most dead jobs of a queue one replay takes unless told (``App.replay(queue=...)``,
#: ``App.areplay``, ``pgworker dead replay --queue Q --all --limit``): one transaction, so
#: it is bounded; calling again replays the rest. One number for the API and the command
#: line (they once differed, 1,000 and 10,000).
REPLAY_LIMIT = 10_000
#: The largest ``limit`` a replay takes: one transaction, its ids one array.
REPLAY_LIMIT_MAX = 1_000_000


def check_replay_limit(limit: object) -> int:
    """A replay's ``limit``: an int (not a bool) from 1 to :data:`REPLAY_LIMIT_MAX`,
    returned as is. Raises ``TypeError`` or ``ValueError`` naming the range: a bool, a
    float or a number past bigint reached the server as a refused statement (a trial)."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"a replay's limit is an int (the most dead jobs of the queue to take, default "
                        f"{REPLAY_LIMIT:,}), got {type(limit).__name__} {limit!r}")
    if not 1 <= limit <= REPLAY_LIMIT_MAX:
        raise ValueError(f"a replay's limit must be from 1 to {REPLAY_LIMIT_MAX:,} (one transaction), got "
                         f"{limit:,}; call again for the rest")
    return limit


class ReplayResult(list):  # type: ignore[type-arg]  # a list[int], as replay returned before
    """What a replay did: the ids put back to pending (the list itself, so code that
    compares or iterates it as before keeps working), and why the others stayed as they
    were.

    ``held_by``: {dead job id: id of the live job holding its dedupe key}: that job does
    the work the key stands for (pending or running, or succeeded within its dedupe
    window), so the dead one stays dead; discard it (``App.cancel``), or cancel the holder
    and replay again. ``not_dead``: ids asked for that are not dead, or unknown.
    ``requeued``: jobs the replayed jobs' death had cancelled (``PARENT_DEAD``, and what
    waited below them), pending again and waiting for their parents (not in the list).
    ``limit_reached``: a queue's replay took ``limit`` dead jobs and the queue holds more
    it could replay: call again for the rest (False for a replay by ids alone). A replay of
    a queue passes over the dead jobs whose dedupe key another job holds (they would stay
    dead), naming up to ``limit`` of them in ``held_by``.
    """

    def __init__(self, replayed: Sequence[int] = (), *, held_by: dict[int, int] | None = None,
                 not_dead: Sequence[int] = (), requeued: Sequence[int] = (),
                 limit_reached: bool = False) -> None:
        super().__init__(replayed)
        self.held_by: dict[int, int] = dict(held_by or {})
        self.not_dead: list[int] = list(not_dead)
        self.requeued: list[int] = list(requeued)
        self.limit_reached = limit_reached

    def __repr__(self) -> str:
        return (f"ReplayResult({list(self)!r}, held_by={self.held_by!r}, not_dead={self.not_dead!r}, "
                f"requeued={self.requeued!r}, limit_reached={self.limit_reached!r})")
