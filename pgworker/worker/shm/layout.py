"""The shared-memory layout of a slot table: one :class:`Slot` per held job, one
:class:`Header` per claimer, the slot states, and :class:`SlotView`, the copy a reader
takes under the lock. The state machine that moves slots is :mod:`.slots`.

A slot moves through::

    EMPTY -> CLAIMED -> RUNNING -> DECIDED -> WRITING -> EMPTY
                \\-> MOVING -> EMPTY       (an idle claimer of the pod takes it over: take_over_next)
                \\-> HANDED_BACK -> EMPTY  (the supervisor takes it back to release it: hand_back_waiting)
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from typing import NamedTuple

# Slot states.
EMPTY = 0
CLAIMED = 1      # claimed, waiting in the claimer's batch (its clocks have not started)
RUNNING = 2      # the handler runs
DECIDED = 3      # outcome decided and recorded in the slot, waiting for the batched write
WRITING = 4      # the outcome write is in flight (renewed: a split write may outlast a lease; never marked lost)
MOVING = 5       # another claimer of the pod is taking it over (moved_to); it renews and settles it
HANDED_BACK = 6  # the supervisor took it back to release it (it waited too long, or the pod stops)
#: ``moved_to`` of a HANDED_BACK slot
SUPERVISOR = -2

LIVE_STATES = (CLAIMED, RUNNING, DECIDED, WRITING, MOVING, HANDED_BACK)
STATE_NAMES = {EMPTY: "empty", CLAIMED: "claimed", RUNNING: "running", DECIDED: "decided",
               WRITING: "writing", MOVING: "moving", HANDED_BACK: "handed_back"}

# What SlotTable.start answers.
NOT_STARTABLE, STARTED, CANCEL_REQUESTED, LEASE_EXPIRED = 0, 1, 2, 3

RENEW_ALIVE = 0
RENEW_PROGRESS = 1

CODE_BYTES = 64
MESSAGE_BYTES = 512
WRITE_FAILURE_BYTES = 500  # what /readyz says of a failing claimer: a connect failure names the DSN, then the cause


class Slot(ctypes.Structure):
    _fields_ = [
        ("state", ctypes.c_int32),
        ("queue_index", ctypes.c_int32),
        ("job_id", ctypes.c_int64),
        ("token", ctypes.c_int64),
        ("order", ctypes.c_int64),           # claim order in this table: a batch runs in this order
        # time.monotonic() (CLOCK_MONOTONIC, shared by the pod's processes)
        ("claimed_at", ctypes.c_double),     # when the claim statement was sent
        ("renewed_at", ctypes.c_double),     # when the last accepted renewal was sent (0: none yet)
        ("started_at", ctypes.c_double),     # when the handler started (0: not yet)
        ("progress_at", ctypes.c_double),    # last ctx.heartbeat() (or the start)
        ("expires_at", ctypes.c_double),     # the lease's expiry by the database clock (Unix seconds)
        ("hard_limit", ctypes.c_double),     # seconds after the start before the attempt is stopped
        ("renew_policy", ctypes.c_int32),
        ("lost", ctypes.c_int32),
        ("cancel", ctypes.c_int32),
        ("attempt", ctypes.c_int32),
        ("task_index", ctypes.c_int32),      # into the sorted task names; -1 when unknown
        ("moved_to", ctypes.c_int32),        # MOVING: index of the claimer taking it over (HANDED_BACK: SUPERVISOR)
        # the decided outcome (DECIDED, WRITING): see pgworker.worker.outcome
        ("outcome", ctypes.c_int32),
        ("permanent", ctypes.c_int32),
        ("delay", ctypes.c_double),
        ("code", ctypes.c_char * CODE_BYTES),
        ("message", ctypes.c_char * MESSAGE_BYTES),
    ]


class Header(ctypes.Structure):
    """One claimer's header: written by the claimer (and, for ``idle``/``hint_queue``, by
    whoever wakes it), read by the supervisor (see :mod:`.header`)."""

    _fields_ = [
        ("loop_at", ctypes.c_double),        # last claimer loop iteration (monotonic)
        ("supervisor_at", ctypes.c_double),  # the supervisor's last tick (monotonic; 0: none watches)
        ("idle", ctypes.c_int32),            # waiting for a wake-up
        ("drained", ctypes.c_int32),         # last claim round found nothing due (drain mode)
        ("stopping", ctypes.c_int32),        # asked to stop claiming
        ("hint_queue", ctypes.c_int32),      # the queue whose work woke it (-1: none)
        ("order_seq", ctypes.c_int64),
        ("jobs_done", ctypes.c_int64),
        ("write_failing_since", ctypes.c_double),  # monotonic start of a run of failed outcome writes (0: ok)
        ("write_failure", ctypes.c_char * WRITE_FAILURE_BYTES),  # why the last outcome write failed
        ("claim_failing_since", ctypes.c_double),  # monotonic start of a run of failed claims (0: ok)
        ("claim_failure", ctypes.c_char * WRITE_FAILURE_BYTES),  # why the last claim failed
        # outcome counts, for the drain summary
        ("succeeded", ctypes.c_int64),
        ("retried", ctypes.c_int64),
        ("dead", ctypes.c_int64),
        ("cancelled", ctypes.c_int64),
        ("released", ctypes.c_int64),
        ("snoozed", ctypes.c_int64),
        ("lost", ctypes.c_int64),
    ]


# A freshly claimed slot written whole, in one call (SlotTable.put_many: a claim's jobs;
# 22 ctypes field stores a job were most of its cost): every field from ``state`` to
# ``delay`` in Slot's order and C alignment, then the NULs that empty ``code`` (with its
# bytes) and ``message``. The checks below fail at import if Slot changes without it.
CLAIMED_SLOT = struct.Struct("@iiqqqddddddiiiiiiiidB63xB")
assert Slot.code.offset == CLAIMED_SLOT.size - 1 - CODE_BYTES, "CLAIMED_SLOT no longer matches Slot's fields"
assert Slot.message.offset == CLAIMED_SLOT.size - 1, "CLAIMED_SLOT no longer matches Slot's fields"
SLOT_BYTES = ctypes.sizeof(Slot)

OUTCOME_FIELDS = ("succeeded", "retried", "dead", "cancelled", "released", "snoozed", "lost")


class SlotEntry(NamedTuple):
    """A freshly claimed job, as :meth:`SlotTable.put_many` records it."""

    job_id: int
    token: int
    queue_index: int
    attempt: int
    hard_limit: float
    renew_policy: int
    task_index: int = -1
    expires_at: float = 0.0


@dataclass(frozen=True)
class SlotView:
    """A copy of one slot, taken under the lock."""

    index: int
    state: int
    queue_index: int
    job_id: int
    token: int
    order: int
    claimed_at: float
    renewed_at: float
    started_at: float
    progress_at: float
    expires_at: float
    hard_limit: float
    renew_policy: int
    attempt: int
    task_index: int
    moved_to: int
    lost: bool
    outcome: int
    permanent: bool
    delay: float
    code: str
    message: str


def view(i: int, s: Slot) -> SlotView:
    """A copy of slot ``i`` (the caller holds the table's lock)."""
    return SlotView(i, s.state, s.queue_index, s.job_id, s.token, s.order, s.claimed_at, s.renewed_at,
                    s.started_at, s.progress_at, s.expires_at, s.hard_limit, s.renew_policy, s.attempt,
                    s.task_index, s.moved_to, bool(s.lost), s.outcome, bool(s.permanent), s.delay,
                    text(s.code), text(s.message))


def text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def fit(text: str, limit: int) -> bytes:
    """UTF-8 of ``text`` cut to fit ``limit`` bytes with its NUL, at a character boundary."""
    data = text.encode("utf-8", "replace")
    if len(data) < limit:
        return data
    return data[:limit - 1].decode("utf-8", "ignore").encode("utf-8")
