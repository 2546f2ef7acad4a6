"""Claim latency as the jobs processed under a held snapshot grow (issue 23).

A ``REPEATABLE READ`` transaction in another session takes its snapshot before the
drain and holds it: no row version the drain makes dead can be removed (VACUUM,
page pruning and ``kill_prior_tuple`` all wait for the horizon), so a claim that scans
the claim index from its start steps over one dead entry (and reads its heap row) for
every job claimed since the snapshot; pgworker's claimers start from their floors
(:mod:`pgworker.claim_floors`) instead. The drain (``pgworker run --drain``, 4 claimers,
defaults) runs in the background on ``jobs`` due jobs, for at most ``budget_seconds``;
each time the jobs processed cross a milestone (10,000, 100,000, ... read from the
table's update counter: a claim and a completion are two updates):

- ``claim_ms``: the claimers' own mean claim duration since the milestone before (from
  their metric files, read live: ``pgworker_claim_duration_seconds``), what the drain
  pays; a flat claim has the same figure at every milestone;
- a probe of pgworker's ``job_claim`` (batch 100, rolled back) from the start of the
  queue's range (``start_ms``, ``start_buffers``: what every claim paid before floors),
  and from a floor at the first claimable job, where a claimer's floor is give or take
  the jobs the other claimers took since its last claim (``buffers``: EXPLAIN ANALYZE
  BUFFERS, a count no neighbour's load changes).

Milestones the budget does not reach are reported as not reached.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import threading
import time
from typing import Any

import psycopg

from pgworker.store import Store
from pgworker.store.lifecycle import CLAIM_GATE_COLUMNS, CLAIM_ID_COLUMN, NO_FLOORS

from .common import QUEUE, BenchSchema, connect
from .drain_runs import Observability, claim_totals, drain

PROBE_BATCH = 100
RUN_AT_COLUMN = CLAIM_GATE_COLUMNS + 9  # ClaimedJob.run_at


def _processed(conn: psycopg.Connection, s: BenchSchema) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = s.q(conn, "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = '{s}.jobs'::regclass")
    return int(row[0][0]) // 2 if row else 0


def probe(dsn: str, schema: str, repeat: int = 5) -> dict[str, float]:
    """pgworker's claim of a batch of 100, rolled back: from the start of the queue's range
    (median ms of ``repeat`` runs, and the shared buffers one claim touches), and from a
    floor at the first job that claim took (buffers)."""
    claim = Store(schema).queries["job_claim"]
    params = {"queue": QUEUE, "limit": PROBE_BATCH, "owner": "bench:probe", "lease_seconds": 60.0,
              "aging_seconds": None, "locked": False, **NO_FLOORS}
    times = []
    rows: list[tuple[Any, ...]] = []
    with psycopg.connect(dsn, application_name="pgworker-bench:probe") as conn:
        conn.prepare_threshold = 0
        _explain_buffers(conn, claim, params)  # the session's first claim reads the catalog: not measured
        for _ in range(repeat):
            t0 = time.perf_counter()
            rows = conn.execute(claim, params).fetchall()
            times.append(1000 * (time.perf_counter() - t0))
            conn.rollback()
        start = _explain_buffers(conn, claim, params)
        taken = [r for r in rows if r[CLAIM_ID_COLUMN] is not None]
        floored = start
        if taken:
            front = min(r[RUN_AT_COLUMN] for r in taken)
            floored = _explain_buffers(conn, claim, dict(params, floor_priorities=[0], floor_at=[front],
                                                         floor_default=front))
    return {"start_ms": round(statistics.median(times), 3), "claimed": len(taken), "start_buffers": start,
            "buffers": floored}


def _explain_buffers(conn: psycopg.Connection, claim: str, params: dict[str, Any]) -> int:
    plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) " + claim, params).fetchone()[0]
    conn.rollback()
    top = plan[0]["Plan"]
    return int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))


def snapshot_growth(dsn: str, *, jobs: int, milestones: tuple[int, ...], budget_seconds: float,
                    clients: int = 4, obs: Observability | None = None) -> dict[str, Any]:
    """The drain under a held snapshot, measured at each milestone; see the module."""
    out: dict[str, Any] = {"jobs": jobs}
    metrics_dir = tempfile.mkdtemp(prefix="pgworker-bench-snapshot-metrics-")
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
                                          timeout=budget_seconds + 300, metrics_dir=metrics_dir)
                except Exception as exc:  # reported by the main thread
                    box["error"] = exc

            t = threading.Thread(target=run, daemon=True)
            t.start()
            t0 = time.monotonic()
            todo = list(milestones)
            spent, claims = 0.0, 0.0
            window_ms: float | None = None
            ended_at: float | None = None
            while todo:
                # read before the count: a milestone the run crossed as it ended counts, once the
                # statistics its backends flush at exit (within a second or so) show it
                alive = t.is_alive()
                if not alive and ended_at is None:
                    ended_at = time.monotonic()
                done = _processed(stats, s) - start_updates
                if done >= todo[0]:
                    m = todo.pop(0)
                    spent_now, claims_now = claim_totals(metrics_dir)
                    if claims_now > claims:  # the claimers' mean since the milestone before
                        window_ms = round(1000 * (spent_now - spent) / (claims_now - claims), 3)
                    # (milestones crossed between two readings share that reading's window)
                    if window_ms is not None:
                        out[f"at_{m}_claim_ms"] = window_ms
                    spent, claims = spent_now, claims_now
                    p = probe(dsn, s.name)
                    out[f"at_{m}_buffers"] = p["buffers"]
                    out[f"at_{m}_start_ms"] = p["start_ms"]
                    out[f"at_{m}_start_buffers"] = p["start_buffers"]
                    out[f"at_{m}_seconds"] = round(time.monotonic() - t0, 2)
                    out[f"at_{m}_processed"] = done
                    continue
                if ended_at is not None and time.monotonic() - ended_at > 3.0:
                    break
                time.sleep(0.2)
            t.join()
            holder.rollback()
    shutil.rmtree(metrics_dir, ignore_errors=True)
    if "error" in box:
        raise box["error"]
    r = box["result"]
    out.update({"jobs_per_second": round(r.rate, 1), "processed": r.jobs, "claim_mean_ms": round(r.claim_mean_ms, 3),
                "reached": max((m for m in milestones if f"at_{m}_claim_ms" in out), default=0),
                "before_start_ms": base["start_ms"], "before_start_buffers": base["start_buffers"],
                "before_buffers": base["buffers"]})
    return out
