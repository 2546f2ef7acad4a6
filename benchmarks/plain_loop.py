"""The plain psycopg loop: the least a Python consumer can do with the same statements.

N processes, each with one autocommit connection and server-side prepared statements:
run ``job_claim`` for a batch, fetch the rows, run ``job_complete`` with their ids and
fencing tokens, until a claim returns nothing. No leases renewed, no slot table, no
handler call, no metrics, no traces: the practical ceiling of a Python process on the
same SQL, between pgbench (no Python at all) and pgworker (everything).
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import psycopg

from pgworker.store import Store
from pgworker.store.lifecycle import NO_FLOORS

from .common import QUEUE, BenchSchema
from .server_cost import RunWal, own_backend_cpu, wal_figures


def _consume(dsn: str, schema: str, batch: int, barrier: Any, out: Any) -> None:
    store = Store(schema)
    claim, complete = store.queries["job_claim"], store.queries["job_complete"]
    with psycopg.connect(dsn, autocommit=True, application_name="pgworker-bench:plain") as conn:
        conn.prepare_threshold = 0
        params = {"queue": QUEUE, "limit": batch, "owner": f"plain:{multiprocessing.current_process().pid}",
                  "lease_seconds": 60.0, "aging_seconds": None, "locked": False, **NO_FLOORS}
        cpu0 = own_backend_cpu(conn)
        barrier.wait()
        mine0 = time.process_time()
        while True:
            cur = conn.execute(claim, params)
            names = [c.name for c in cur.description]
            i, t = names.index("id"), names.index("lease_token")
            rows = [r for r in cur.fetchall() if r[i] is not None]
            if not rows:
                out.put((own_backend_cpu(conn) - cpu0, time.process_time() - mine0))
                return
            conn.execute(complete, {"ids": [r[i] for r in rows], "tokens": [r[t] for r in rows],
                                    "has_result": [False] * len(rows), "results": [None] * len(rows),
                                    "results_channel": store.results_channel}).fetchall()


def plain_loop(schema: BenchSchema, *, processes: int, batch: int, since_id: int = 0) -> tuple[int, float]:
    """Drain ``schema`` with the plain loop; returns (jobs, seconds) from the rows."""
    n, seconds, _ = plain_loop_costs(schema, processes=processes, batch=batch, since_id=since_id)
    return n, seconds


def plain_loop_costs(schema: BenchSchema, *, processes: int, batch: int,
                     since_id: int = 0) -> tuple[int, float, dict[str, float]]:
    """:func:`plain_loop`, with what it cost: its processes' CPU, the server's CPU and the
    WAL written, per job (µs, µs, bytes)."""
    import resource

    from .common import ServerCpu

    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_consume, args=(schema.dsn, schema.name, batch, barrier, out))
             for _ in range(processes)]
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    server, wal = ServerCpu(), RunWal(schema.dsn, schema.name)
    for p in procs:
        p.start()
    while any(p.is_alive() for p in procs):
        server.sample()
        time.sleep(0.1)
    backends = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(600)
        if p.exitcode != 0:
            raise RuntimeError(f"plain loop process exited {p.exitcode}")
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    lsn, own = wal.finish()
    n, seconds = schema.window(since_id)
    cpu = (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime)
    per = lambda v: round(v / n, 1) if n else 0.0  # noqa: E731
    return n, seconds, {"cpu_client_us_per_job": per(1e6 * cpu), "cpu_server_us_per_job": per(1e6 * server.seconds),
                        "cpu_backends_us_per_job": per(1e6 * sum(b for b, _ in backends)),
                        "cpu_loop_us_per_job": per(1e6 * sum(c for _, c in backends)), **wal_figures(lsn, own, n)}
