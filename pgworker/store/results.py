"""Results: what succeeded jobs returned (sql/queries/results.sql)."""

from __future__ import annotations

from typing import Any

import psycopg

from .base import StoreBase
from .plan import Exec, Plan, run


class ResultStatements(StoreBase):
    """Reads of ``job_results`` (the fenced success writes it: :meth:`complete`)."""

    def job_result(self, conn: psycopg.Connection, job_id: int) -> dict[str, Any] | None:
        """``{state, last_error_code, has_result, result}`` of job ``job_id`` (``result``
        decoded from JSON; None with ``has_result``: stored without it), or None when
        there is no such job."""
        return run(conn, self.job_result_plan(job_id))

    def job_result_plan(self, job_id: int) -> Plan[dict[str, Any] | None]:
        """:meth:`job_result` as a plan (:mod:`pgworker.store.plan`): the async reads run it."""
        rows = yield Exec(self.queries["job_result_get"], {"id": job_id}, dict_rows=True)
        return rows[0] if rows else None
