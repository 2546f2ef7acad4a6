"""A handler's own transaction, its durable steps and effects (sql/queries/effects.sql)."""

from __future__ import annotations

import psycopg

from .base import StoreBase


class EffectStatements(StoreBase):
    """The statements of pgworker/effects/: reading a job back after a failed commit."""

    def commit_read_back(self, conn: psycopg.Connection, job_id: int) -> tuple[str, int] | None:
        """(state, lease_token) of a job once no other transaction holds its row (after a
        handler's transaction failed to commit, to learn whether it did); None if it is gone.
        Waits at most the session's ``lock_timeout``."""
        row = self._exec(conn, "job_commit_read_back", {"id": job_id}).fetchone()
        return None if row is None else (row[0], row[1])
