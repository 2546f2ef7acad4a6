"""The plain psycopg loop: the least a Python consumer can do with the same statements.

N processes, each with one autocommit connection and server-side prepared statements:
run ``job_claim`` for a batch, fetch the rows, run ``job_complete`` with their ids and
fencing tokens, until a claim returns nothing. No leases renewed, no slot table, no
handler call, no metrics, no traces: the practical ceiling of a Python process on the
same SQL, between pgbench (no Python at all) and pgworker (everything).
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import psycopg

from pgworker.store import Store

from .common import QUEUE, BenchSchema


def _consume(dsn: str, schema: str, batch: int, barrier: Any) -> None:
    store = Store(schema)
    claim, complete = store.queries["job_claim"], store.queries["job_complete"]
    with psycopg.connect(dsn, autocommit=True, application_name="pgworker-bench:plain") as conn:
        conn.prepare_threshold = 0
        params = {"queue": QUEUE, "limit": batch, "owner": f"plain:{multiprocessing.current_process().pid}",
                  "lease_seconds": 60.0, "aging_seconds": None, "locked": False}
        barrier.wait()
        while True:
            cur = conn.execute(claim, params)
            names = [c.name for c in cur.description]
            i, t = names.index("id"), names.index("lease_token")
            rows = [r for r in cur.fetchall() if r[i] is not None]
            if not rows:
                return
            conn.execute(complete, {"ids": [r[i] for r in rows], "tokens": [r[t] for r in rows]}).fetchall()


def plain_loop(schema: BenchSchema, *, processes: int, batch: int, since_id: int = 0) -> tuple[int, float]:
    """Drain ``schema`` with the plain loop; returns (jobs, seconds) from the rows."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    procs = [ctx.Process(target=_consume, args=(schema.dsn, schema.name, batch, barrier)) for _ in range(processes)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
        if p.exitcode != 0:
            raise RuntimeError(f"plain loop process exited {p.exitcode}")
    return schema.window(since_id)
