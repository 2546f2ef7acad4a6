"""A handler's own transaction, its durable steps and effects (sql/queries/effects.sql)."""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import psycopg

from ..jobs import Lease
from .base import StoreBase


class StepRecord(NamedTuple):
    """A recorded step or effect: ``kind`` 'step' | 'effect', ``status`` 'started' |
    'done', ``result`` its JSON value (decoded), ``idempotency_key`` (effects)."""

    kind: str
    status: str
    result: Any
    idempotency_key: str | None


class EffectStatements(StoreBase):
    """The statements of pgworker/effects/: reading a job back after a failed commit, and
    the fenced records of durable steps and external effects."""

    def commit_read_back(self, conn: psycopg.Connection, job_id: int) -> tuple[str, int] | None:
        """(state, lease_token) of a job once no other transaction holds its row (after a
        handler's transaction failed to commit, to learn whether it did); None if it is gone.
        Waits at most the session's ``lock_timeout``."""
        row = self._exec(conn, "job_commit_read_back", {"id": job_id}).fetchone()
        return None if row is None else (row[0], row[1])

    # -- durable steps and external effects (ctx.step, ctx.effect) ---------------------

    def step_get(self, conn: psycopg.Connection, job_id: int, name: str) -> StepRecord | None:
        """The recorded step or effect ``name`` of a job, or None."""
        row = self._exec(conn, "job_step_get", {"id": job_id, "name": name}).fetchone()
        return None if row is None else StepRecord(*row)

    def step_record(self, conn: psycopg.Connection, lease: Lease, name: str, *, kind: str, status: str,
                    result_json: str | None, key: str | None, max_steps: int) -> tuple[bool, int, bool]:
        """Record a step ('done', ``result_json`` a JSON text) or an effect ('started', with
        its idempotency ``key``), fenced by ``lease``, below ``max_steps`` records per job.
        Returns (the fence held, records before this one, the row was written)."""
        row = self._exec(conn, "job_step_record", {
            "id": lease.job_id, "token": lease.token, "name": name, "kind": kind, "status": status,
            "result": result_json, "key": key, "max_steps": max_steps}).fetchone()
        return bool(row[0]), int(row[1]), bool(row[2])

    def effect_done(self, conn: psycopg.Connection, lease: Lease, name: str, result_json: str,
                    by: str = "worker") -> bool:
        """Mark a started effect done with its result (fenced by ``lease``); False when
        the fence refused (or no started record of that name exists)."""
        return self._exec(conn, "job_effect_done", {"id": lease.job_id, "token": lease.token, "name": name,
                                                    "result": result_json, "by": by}).fetchone() is not None

    def steps_of(self, conn: psycopg.Connection, job_id: int) -> list[dict[str, Any]]:
        """Every step and effect of a job, oldest first, as dicts (``jobs show``)."""
        cur = self._exec(conn, "job_steps_of", {"id": job_id})
        names = [d.name for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    def effects_uncertain(self, conn: psycopg.Connection, ids: Sequence[int], limit: int = 20) -> list[tuple[int, str]]:
        """(job id, effect name) of these jobs' effects started and never recorded done."""
        return [(r[0], r[1]) for r in self._exec(conn, "job_effects_uncertain",
                                                 {"ids": list(ids), "limit": limit}).fetchall()]

    def effect_resolve(self, conn: psycopg.Connection, job_id: int, name: str, *, retry: bool,
                       result_json: str | None, by: str) -> tuple[str, int] | None:
        """An operator's resolution of an uncertain effect (see ``job_effect_resolve``):
        (the job's state, records changed), or None when no such started effect exists on
        a job that is not running."""
        row = self._exec(conn, "job_effect_resolve", {"id": job_id, "name": name, "retry": retry,
                                                      "result": result_json, "by": by}).fetchone()
        return None if row is None else (row[0], int(row[1]))

    def steps_clean(self, conn: psycopg.Connection, ids: Sequence[int], *, actor: str | None) -> int:
        """Forget every step and effect of these jobs, audited (``steps_forgotten``, by
        ``actor``) per job that had any; returns how many records went."""
        return int(self._exec(conn, "job_steps_clean", {"ids": list(ids), "actor": actor}).fetchone()[0])
