"""Experiment (issue 23 design): a claim that starts from the claimer's last position stays
flat under a held snapshot; the claim that starts from the index's beginning does not.

    python -m benchmarks.snapshot_claim_experiment [--jobs 1100000] [--milestones 10000,100000,1000000]

A scratch pgworker schema with the design's ``claim_at`` column (when the job became
claimable: max(run_at, the moment it entered the claimable set)) and a claim index on
(queue, priority DESC, claim_at, id); jobs enqueued 1 ms apart. A REPEATABLE READ
snapshot is taken and held; one session claims batches of 100 and completes them with
the hinted claim (``claim_at >= hint - window``, the hint being the largest claim_at of
its previous batch). At each milestone both claims are EXPLAINed (ANALYZE, BUFFERS,
rolled back): the hinted one, and the same claim without the hint (the scan today's
claim does). Buffers and milliseconds per claim of 100 are printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import psycopg
from psycopg import sql

from pgworker.migrate import drop_schema, migrate

from .common import LOCAL_DSN, connect

SCHEMA = "pgworker_bench_snapclaim"
CLAIM = """
WITH c AS (
    SELECT id FROM {s}.jobs
    WHERE queue = 'bench' AND state = 'pending' AND NOT blocked AND priority = 0
      AND claim_at <= now() AND claim_at >= %(hint)s::timestamptz - make_interval(secs => %(window)s)
    ORDER BY priority DESC, claim_at, id
    LIMIT 100
    FOR UPDATE SKIP LOCKED
)
UPDATE {s}.jobs AS j
SET state = 'running', attempts = j.attempts + 1, lease_token = j.lease_token + 1, lease_owner = 'x',
    lease_expires_at = statement_timestamp() + interval '60 seconds', started_at = statement_timestamp()
FROM c WHERE j.id = c.id
RETURNING j.id, j.lease_token, j.claim_at
"""
COMPLETE = """
UPDATE {s}.jobs AS j SET state = 'succeeded', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS f(id, token)
WHERE j.id = f.id AND j.state::text = 'running' AND j.lease_token = f.token
"""


def explain(conn: psycopg.Connection, q: sql.Composed, params: dict) -> tuple[int, float]:
    t0 = time.perf_counter()
    plan = conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) ") + q, params).fetchone()[0]
    ms = 1000 * (time.perf_counter() - t0)
    conn.rollback()
    top = plan[0]["Plan"]
    return top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0), ms


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default=LOCAL_DSN)
    p.add_argument("--jobs", type=int, default=1_100_000)
    p.add_argument("--milestones", default="10000,100000,300000,1000000")
    p.add_argument("--window", type=float, default=0.1, help="seconds rescanned behind the hint")
    p.add_argument("--json")
    a = p.parse_args(argv)
    milestones = [int(m) for m in a.milestones.split(",")]
    s = sql.Identifier(SCHEMA)
    out = []
    with connect(a.dsn) as conn:
        drop_schema(conn, SCHEMA)
        migrate(conn, SCHEMA)
        conn.execute(sql.SQL("ALTER TABLE {}.jobs ADD COLUMN claim_at timestamptz; "
                             "CREATE INDEX jobs_claim_at_idx ON {}.jobs (queue, priority DESC, claim_at, id) "
                             "WHERE state = 'pending' AND NOT blocked").format(s, s))
        for start in range(0, a.jobs, 200_000):
            conn.execute(sql.SQL("INSERT INTO {}.jobs (queue, task, payload, run_at, claim_at) "
                                 "SELECT 'bench', 'noop', '{{}}', t, t FROM (SELECT now() - interval '2 hours' "
                                 "+ g * interval '1 millisecond' AS t FROM generate_series(%s, %s) AS g) AS x")
                         .format(s), [start + 1, min(a.jobs, start + 200_000)])
        conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(s))
    claim, complete = sql.SQL(CLAIM).format(s=s), sql.SQL(COMPLETE).format(s=s)
    try:
        with psycopg.connect(a.dsn) as holder, psycopg.connect(a.dsn) as work, psycopg.connect(a.dsn) as probe:
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute(sql.SQL("SELECT count(*) FROM {}.jobs").format(s))  # the snapshot, held
            work.autocommit = True
            work.prepare_threshold = 0
            hint, done, todo, t0 = "-infinity", 0, list(milestones), time.monotonic()
            while todo:
                rows = work.execute(claim, {"hint": hint, "window": a.window}).fetchall()
                if not rows:
                    break
                work.execute(complete, {"ids": [r[0] for r in rows], "tokens": [r[1] for r in rows]})
                hint = max(r[2] for r in rows).isoformat()
                done += len(rows)
                if done >= todo[0]:
                    todo.pop(0)
                    hinted = explain(probe, claim, {"hint": hint, "window": a.window})
                    full = explain(probe, claim, {"hint": "-infinity", "window": a.window})
                    row = {"processed": done, "seconds": round(time.monotonic() - t0, 1),
                           "hinted_buffers": hinted[0], "hinted_ms": round(hinted[1], 2),
                           "from_start_buffers": full[0], "from_start_ms": round(full[1], 2)}
                    out.append(row)
                    print(json.dumps(row), flush=True)
            holder.rollback()
    finally:
        with connect(a.dsn) as conn:
            drop_schema(conn, SCHEMA)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
