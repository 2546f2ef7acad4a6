"""Claim latency as the jobs processed under a held snapshot grow (issue 23).

A ``REPEATABLE READ`` transaction in another session takes its snapshot before the
drain and holds it: no row version the drain makes dead can be removed (VACUUM,
page pruning and ``kill_prior_tuple`` all wait for the horizon), so a claim that scans
the claim index from its start steps over one dead entry (and reads its heap row) for
every job claimed since the snapshot. The drain (``pgworker run --drain``, 4 claimers,
defaults) runs in the background on ``jobs`` due jobs, for at most ``budget_seconds``;
each time the jobs processed cross a milestone (10,000, 100,000, ... read from the
table's update counter: a claim and a completion are two updates), a probe runs
pgworker's own ``job_claim`` (batch 100) a few times in a transaction it rolls back:
the median time, and the buffers one claim touches (EXPLAIN ANALYZE, BUFFERS: a count
that no neighbour's load changes). A flat claim has the same figures at every
milestone. Milestones the budget does not reach are reported as not reached; the
growth is quadratic in the jobs processed while the claim re-walks what it passed,
so a run is sized by its budget, not its job count.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import psycopg

from pgworker.store import Store

from .common import QUEUE, BenchSchema, connect
from .drain_runs import Observability, drain

PROBE_BATCH = 100


def _processed(conn: psycopg.Connection, s: BenchSchema) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = s.q(conn, "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = '{s}.jobs'::regclass")
    return int(row[0][0]) // 2 if row else 0


def probe(dsn: str, schema: str, repeat: int = 5) -> dict[str, float]:
    """pgworker's claim of a batch of 100, rolled back: median ms of ``repeat`` runs, and
    the shared buffers one claim touches."""
    claim = Store(schema).queries["job_claim"]
    params = {"queue": QUEUE, "limit": PROBE_BATCH, "owner": "bench:probe", "lease_seconds": 60.0,
              "aging_seconds": None, "locked": False}
    times = []
    with psycopg.connect(dsn, application_name="pgworker-bench:probe") as conn:
        conn.prepare_threshold = 0
        for _ in range(repeat):
            t0 = time.perf_counter()
            rows = conn.execute(claim, params).fetchall()
            times.append(1000 * (time.perf_counter() - t0))
            conn.rollback()
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) " + claim, params).fetchone()[0]
        conn.rollback()
    top = plan[0]["Plan"]
    return {"claim_ms": round(statistics.median(times), 3), "claimed": sum(1 for r in rows if r[4] is not None),
            "buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)}


def snapshot_growth(dsn: str, *, jobs: int, milestones: tuple[int, ...], budget_seconds: float,
                    clients: int = 4, obs: Observability | None = None) -> dict[str, Any]:
    """The drain under a held snapshot, probed at each milestone; see the module."""
    out: dict[str, Any] = {"jobs": jobs}
    with BenchSchema(dsn, "snapg") as s:
        s.fill(jobs)
        base = probe(dsn, s.name)
        with connect(dsn) as holder, connect(dsn) as stats:
            holder.autocommit = False
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            s.q(holder, "SELECT count(*) FROM {s}.jobs")  # the snapshot, now
            start_updates = _processed(stats, s)
            box: dict[str, Any] = {}

            def run() -> None:
                try:
                    box["result"] = drain(s, concurrency=clients, obs=obs, max_duration=budget_seconds,
                                          timeout=budget_seconds + 300)
                except Exception as exc:  # reported by the main thread
                    box["error"] = exc

            t = threading.Thread(target=run, daemon=True)
            t.start()
            t0 = time.monotonic()
            todo = list(milestones)
            while todo and t.is_alive():
                done = _processed(stats, s) - start_updates
                if done >= todo[0]:
                    m = todo.pop(0)
                    p = probe(dsn, s.name)
                    out[f"at_{m}_claim_ms"] = p["claim_ms"]
                    out[f"at_{m}_buffers"] = p["buffers"]
                    out[f"at_{m}_seconds"] = round(time.monotonic() - t0, 2)
                    out[f"at_{m}_processed"] = done
                    continue
                time.sleep(0.2)
            t.join()
            holder.rollback()
        if "error" in box:
            raise box["error"]
    r = box["result"]
    out.update({"jobs_per_second": round(r.rate, 1), "processed": r.jobs, "claim_mean_ms": round(r.claim_mean_ms, 3),
                "reached": max((m for m in milestones if f"at_{m}_claim_ms" in out), default=0),
                "before_claim_ms": base["claim_ms"], "before_buffers": base["buffers"]})
    return out
