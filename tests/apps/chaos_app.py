"""Tasks for the chaos soak (benchmarks/chaos.py, tests/acceptance/test_chaos.py).

Every execution of ``effect`` writes one row to an *external* ledger: a table in another
PostgreSQL server (LEDGER_DSN, the shared server, never the cluster the soak restarts),
with the job's idempotency key, id, attempt and fencing token. The harness compares the
ledger with the jobs table: a job whose effect appears twice must have lost a lease (or
its worker died after the effect), and the ledger row of the succeeding token must exist.

Environment: LEDGER_DSN, LEDGER_SCHEMA (set by the harness); PGWORKER_* as usual.
Payload: {"n": int, "b": batch, "sleep": seconds, "kind": "ok" | "fail_first" | "poison"}.
"""

from __future__ import annotations

import os
import threading
import time

import psycopg
from psycopg import sql

import pgworker

app = pgworker.App()
RETRY = pgworker.RetryPolicy(base_seconds=0.2, factor=2, max_seconds=2.0, jitter=0.5)

_local = threading.local()


def _ledger() -> psycopg.Connection:
    """One ledger connection per process (and thread), reopened when it broke."""
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed or conn.broken:
        conn = psycopg.connect(os.environ["LEDGER_DSN"], autocommit=True, application_name="chaos-ledger")
        _local.conn = conn
    return conn


def record_effect(payload: dict, ctx: pgworker.JobContext) -> None:
    # One row per (job, fencing token); a second run under the same token (which would be
    # a bug) bumps `times`. No retry here: the ledger server is not the one under attack.
    stmt = sql.SQL("INSERT INTO {}.effects (job_id, n, idempotency_key, attempt, lease_token, pid) "
                   "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (job_id, lease_token) "
                   "DO UPDATE SET times = effects.times + 1").format(sql.Identifier(os.environ["LEDGER_SCHEMA"]))
    _ledger().execute(stmt, [ctx.job_id, payload["n"], ctx.idempotency_key, ctx.attempt,
                             ctx.lease_token, os.getpid()])


@app.task(name="effect", queue="chaos", max_attempts=25, retry=RETRY)
def effect(payload: dict, ctx: pgworker.JobContext) -> None:
    kind = payload.get("kind", "ok")
    if kind == "poison":
        raise pgworker.Permanent("poison job: fails permanently before its effect", code="POISON")
    if kind == "fail_first" and ctx.attempt == 1:
        raise RuntimeError("transient failure before the effect")
    end = time.monotonic() + float(payload.get("sleep", 0))
    while time.monotonic() < end:
        ctx.heartbeat()
        time.sleep(min(0.05, max(0.0, end - time.monotonic())))
    # The side effect is the last thing the handler does: any later run of this job is a
    # duplicate that only a lost lease or a dead worker may explain.
    record_effect(payload, ctx)
