"""What one PostgreSQL primary sustains: the capacity model of docs/scaling.md, from the
server's measured cost per job in the same run (issue 23).

A job's whole life on the server is its enqueue, its claim and its completion (plus one
lease renewal per renewal interval it runs past, and the retention pruner's DELETE, not
counted here: it runs off the hot path). ``enqueue_cost`` measures the enqueue's share:
the server CPU of the session's own backend (/proc, the local server) and the WAL of its
own transactions (pg_walinspect), for ``app.enqueue_many`` of 100 jobs per call, beside
the minimal lease queue's 100-row INSERT measured the same way. The claim and the
completion come from the run's ``cost pgworker b100`` drain (4 claimers, batch 100: the
backends' CPU and the run's own WAL). ``model`` turns the sum into jobs/s per core and
the WAL rate that implies for replicas and backups.

The model is linear on purpose: it says what the CPU and the WAL allow, not what lock
contention, the disk's fsync rate or the network allow on a given machine; docs/scaling.md
says where it stops holding.
"""

from __future__ import annotations

import time
from typing import Any

from psycopg import sql

from .common import QUEUE, TASK, BenchSchema, connect
from .reference import RefSchema
from .server_cost import RunWal, own_backend_cpu, wal_figures

#: cores of the primaries the model is printed for
CORES = (2, 4, 8, 16, 32, 64)
#: the share of the primary's CPU the queue may use (the rest: the application's own
#: queries, autovacuum, replication, checkpoints, headroom for bursts)
CPU_BUDGET = 0.5


def enqueue_cost(dsn: str, *, jobs: int = 20_000, batch: int = 100) -> dict[str, float]:
    """Server CPU µs and WAL bytes per job of ``app.enqueue_many`` at ``batch`` jobs per call
    (one connection, one transaction per call). Needs a local server (/proc)."""
    from pgworker import App
    from pgworker.config import Settings

    with BenchSchema(dsn, "enqcost") as s, connect(dsn) as conn:
        conn.autocommit = False
        app = App(settings=Settings.from_env(environ={}, dsn=s.dsn, schema=s.name, tracing=True))
        try:
            specs = [(TASK, {"i": i}) for i in range(batch)]
            app.enqueue_many(specs, conn=conn)  # warm-up: plans, caches
            conn.commit()
            wal, cpu0, t0 = RunWal(dsn, s.name), own_backend_cpu(conn), time.perf_counter()
            for _ in range(jobs // batch):
                app.enqueue_many(specs, conn=conn)
                conn.commit()
            elapsed, cpu = time.perf_counter() - t0, own_backend_cpu(conn) - cpu0
            lsn, own = wal.finish()
        finally:
            app.close()
    n = (jobs // batch) * batch
    return {"jobs_per_second": n / elapsed, "cpu_backend_us_per_job": round(1e6 * cpu / n, 1),
            **wal_figures(lsn, own, n)}


def reference_enqueue_cost(dsn: str, *, jobs: int = 20_000, batch: int = 100) -> dict[str, float]:
    """The same figures for the minimal lease queue: one ``batch``-row INSERT per transaction."""
    with RefSchema(dsn) as s, connect(dsn) as conn:
        conn.autocommit = False
        conn.prepare_threshold = 0
        rows = sql.SQL(", ").join(sql.SQL("(%s, %s)") for _ in range(batch))
        q = s.q("INSERT INTO {s}.jobs (queue_name, payload) VALUES ") + rows
        params = [v for i in range(batch) for v in (QUEUE, f'{{"i": {i}}}')]
        conn.execute(q, params)
        conn.commit()
        wal, cpu0, t0 = RunWal(dsn, s.name), own_backend_cpu(conn), time.perf_counter()
        for _ in range(jobs // batch):
            conn.execute(q, params)
            conn.commit()
        elapsed, cpu = time.perf_counter() - t0, own_backend_cpu(conn) - cpu0
        lsn, own = wal.finish()
    n = (jobs // batch) * batch
    return {"jobs_per_second": n / elapsed, "cpu_backend_us_per_job": round(1e6 * cpu / n, 1),
            **wal_figures(lsn, own, n)}


def _median(doc: dict[str, Any], key: str, name: str) -> float | None:
    entry = doc["results"].get(key, {}).get(name)
    return None if entry is None else entry["median"]


def model(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The model's inputs (µs and bytes per job, pgworker's and the reference's) and its rows
    (one per core count: jobs/s and the WAL rate at that rate), or None when the run lacks
    the cost and capacity sections."""
    parts = {
        "pgworker": (_median(doc, "capacity enqueue", "cpu_backend_us_per_job"),
                     _median(doc, "cost pgworker b100", "cpu_backends_us_per_job"),
                     _median(doc, "capacity enqueue", "wal_bytes_per_job"),
                     _median(doc, "cost pgworker b100", "wal_bytes_per_job")),
        "minimal lease queue": (_median(doc, "capacity ref enqueue", "cpu_backend_us_per_job"),
                                _median(doc, "ref loop", "cpu_backends_us_per_job"),
                                _median(doc, "capacity ref enqueue", "wal_bytes_per_job"),
                                _median(doc, "ref loop", "wal_bytes_per_job")),
    }
    if any(v is None for v in parts["pgworker"]):
        return None
    out: dict[str, Any] = {"cpu_budget": CPU_BUDGET, "systems": {}}
    for name, (cpu_enq, cpu_run, wal_enq, wal_run) in parts.items():
        if any(v is None for v in (cpu_enq, cpu_run, wal_enq, wal_run)):
            continue
        cpu, wal = cpu_enq + cpu_run, wal_enq + wal_run  # type: ignore[operator]
        if cpu <= 0:  # a run too small for one clock tick of backend CPU (10 ms): no model
            continue
        per_core = 1e6 / cpu
        out["systems"][name] = {
            "cpu_us_per_job": {"enqueue": cpu_enq, "claim + complete": cpu_run, "total": round(cpu, 1)},
            "wal_bytes_per_job": {"enqueue": wal_enq, "claim + complete": wal_run, "total": round(wal)},
            "rows": [{"cores": n, "jobs_per_second": per_core * n * CPU_BUDGET,
                      "wal_mib_per_second": per_core * n * CPU_BUDGET * wal / 2**20,
                      "wal_gib_per_day": per_core * n * CPU_BUDGET * wal * 86_400 / 2**30} for n in CORES]}
    return out


def markdown(doc: dict[str, Any]) -> list[str]:
    """The report's "capacity of one primary" section (empty without the inputs)."""
    m = model(doc)
    if m is None or not m["systems"]:
        return []
    lines = ["## Capacity of one primary (the model of docs/scaling.md, from this run's costs)", "",
             "Server CPU µs and WAL bytes per job's whole life (enqueue at 100 per call, claim and completion at "
             "batch 100 with 4 claimers; no lease renewals, no retries), and what a primary sustains when the queue "
             f"may use {m['cpu_budget']:.0%} of its cores. Linear in cores: lock contention, fsync and the network "
             "are not in it (docs/scaling.md).", "",
             "| system | CPU µs/job: enqueue + claim/complete = total | WAL B/job: enqueue + claim/complete = total |",
             "|---|---:|---:|"]
    for name, s in m["systems"].items():
        c, w = s["cpu_us_per_job"], s["wal_bytes_per_job"]
        lines.append(f"| {name} | {c['enqueue']:,.1f} + {c['claim + complete']:,.1f} = **{c['total']:,.1f}** | "
                     f"{w['enqueue']:,.0f} + {w['claim + complete']:,.0f} = **{w['total']:,.0f}** |")
    lines += ["", "| primary's cores | " + " | ".join(f"{name}: jobs/s (WAL MiB/s, GiB/day)" for name in m["systems"])
              + " |", "|---:|" + "---:|" * len(m["systems"])]
    for i, n in enumerate(CORES):
        cells = []
        for s in m["systems"].values():
            row = s["rows"][i]
            cells.append(f"{row['jobs_per_second']:,.0f} ({row['wal_mib_per_second']:,.1f}, "
                         f"{row['wal_gib_per_day']:,.0f})")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return lines + [""]
