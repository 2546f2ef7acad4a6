"""Results: what succeeded jobs returned (sql/queries/results.sql)."""

from __future__ import annotations

from typing import Any

import psycopg

from .base import StoreBase


class ResultStatements(StoreBase):
    """Reads of ``job_results`` (the fenced success writes it: :meth:`complete`)."""

    def job_result(self, conn: psycopg.Connection, job_id: int) -> dict[str, Any] | None:
        """``{state, last_error_code, has_result, result}`` of job ``job_id`` (``result``
        decoded from JSON; None with ``has_result``: stored without it), or None when
        there is no such job."""
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["job_result_get"], {"id": job_id}).fetchone()
