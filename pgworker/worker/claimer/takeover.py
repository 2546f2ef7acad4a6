"""Taking over a job that waits unstarted in a peer's batch.

A claim may take several jobs (batches are sized from run times, so fast work makes them
large) and its claimer runs them one at a time. A claimer of the same pod whose own claim
came back empty takes over the next job waiting in a peer's batch instead of sleeping, so
no job claimed by the pod waits behind another while one of its claimers is idle. The job
keeps its lease and fencing token: only the slot moves, from the peer's table to the
taker's (CLAIMED -> MOVING there, then empty once the job is in the taker's table; see
:mod:`pgworker.worker.shm.slots`), and the row's ``lease_owner`` becomes the taker. The taker
reads the job's row by id and token (``job_take_over``, refused once the lease has
expired), since the payload lives in the peer's process, not in shared memory. The old
slot's ``lost`` and ``cancel`` flags, set by the renewer and the lease clock while the
job waited there, move with it (see ``SlotTable.empty_moved``).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import psycopg

from ...jobs import ClaimedJob, Lease
from ..shm import layout as s
from ..shm.slots import SlotTable, SlotTableBusy
from .connection import ClaimerConnection

log = logging.getLogger("pgworker.claimer")


class PeerJobs:
    """The jobs waiting in the batches of the pod's other claimers (``peers[index]`` is
    this claimer's own table)."""

    def __init__(self, peers: Sequence[SlotTable], index: int, db: ClaimerConnection, store: Any, *,
                 owner: str) -> None:
        self.peers = peers
        self.index = index
        self.db = db
        self.store = store
        self.owner = owner  # this claimer's lease_owner

    def take(self) -> tuple[ClaimedJob, s.SlotView, SlotTable] | None:
        """The next waiting job of a peer, now this claimer's to run: (the job, its slot as
        it was in the peer's table, that table). Call :meth:`moved` once it is recorded
        in this claimer's table. None when nothing waits, or the database is away (the
        job is given back to its peer then)."""
        for i, peer in enumerate(self.peers):
            if i == self.index:
                continue
            try:
                v = peer.take_over_next(self.index)
            except SlotTableBusy:
                continue
            if v is None:
                continue
            try:
                job = self._fetch(v)
            except psycopg.Error:
                _quietly(peer.undo_take_over, v)  # the database is away: its owner runs it
                return None
            if job is None:  # its lease was lost meanwhile: nothing to run
                self.moved(peer, v)
                continue
            log.debug("claimer %s takes over job %s from claimer %s", self.index, job.id, i)
            return job, v, peer
        return None

    def moved(self, peer: SlotTable, v: s.SlotView) -> tuple[bool, bool]:
        """Empty the job's old slot in the peer's table; returns the (lost, cancel) flags
        it had gained (see SlotTable.empty_moved)."""
        try:
            return peer.empty_moved(v.index, v.job_id, v.token)
        except SlotTableBusy:
            return False, False  # its owner is stopped holding the lock: the supervisor settles it

    def _fetch(self, v: s.SlotView) -> ClaimedJob | None:
        """The job behind a peer's slot, from the table, now owned by this claimer; None
        when its lease was lost meanwhile. Raises psycopg errors."""
        with self.db.lock:
            if self.db.conn is None:
                raise psycopg.OperationalError("no connection")
            return self.store.take_over(self.db.conn, Lease(v.job_id, v.token), owner=self.owner)


def _quietly(method: Any, v: s.SlotView) -> None:
    try:
        method(v.index, v.job_id, v.token)
    except SlotTableBusy:
        pass  # its owner died holding the lock: the supervisor resets that table
