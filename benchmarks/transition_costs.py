"""What each transition costs the server, exactly: WAL records and bytes, index entries
per index, HOT or not, backend CPU; pgworker's schema beside the minimal lease queue's.

    python -m benchmarks.transition_costs [--dsn DSN] [--jobs 20000] [--batch 100]
        [--renewals 1] [--variant today,ref,...] [--repeat 1] [--json FILE]

Each transition runs on ``--jobs`` jobs in batches of ``--batch``, each batch its own
transaction on one connection (as a claimer runs them), on a fresh scratch schema. The
WAL of the transition's own transactions is read back with pg_walinspect
(``pg_get_wal_records_info``, filtered on their transaction ids), so other sessions on
the server do not count: bytes per job with and without full-page images, B-tree leaf
inserts per index (``INSERT_LEAF`` records by relfilenode), and heap updates HOT or not
(``HOT_UPDATE`` / ``UPDATE`` records). CPU is the backend's own, from /proc (10 ms ticks:
use enough jobs). Needs a superuser (CREATE EXTENSION pg_walinspect) and a local server.

Variants (``VARIANTS``) are DDL applied after the migration, for the design's experiments
(issue 23): the statements are pgworker's own unless the variant says otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from typing import Any, Callable

import psycopg
from psycopg import sql

from pgworker.migrate import drop_schema, migrate
from pgworker.store import Store
from pgworker.store.base import results_channel
from pgworker.store.lifecycle import CLAIM_ID_COLUMN, CLAIM_TOKEN_COLUMN, NO_FLOORS

from .common import LOCAL_DSN, QUEUE, connect, cpu_seconds
from .reference import CLAIM as REF_CLAIM, COMPLETE as REF_COMPLETE, DDL as REF_DDL

# The claim's aging arm, skipped when the queue has no aging bound (LIMIT 0 does not run
# its scan): without jobs_due_idx its ORDER BY run_at would otherwise sort the queue.
AGED_LIMIT = ("    ORDER BY run_at\n    LIMIT (SELECT n FROM allowance)\n",
              "    ORDER BY run_at\n    LIMIT CASE WHEN (SELECT aging_seconds FROM gate) IS NULL THEN 0 "
              "ELSE (SELECT n FROM allowance) END\n")
# variants whose claim statement changes: name -> (old, new) text replacements in job_claim
CLAIM_CHANGES: dict[str, list[tuple[str, str]]] = {
    name: [AGED_LIMIT] for name in ("lean", "lean-ff50", "lean-ff85", "today-aged-skip")}

# P3 + P4 of the design (P1, one running index without lease_expires_at, is the schema
# since migration 0010): no jobs_due_idx, retention on a BRIN index
LEAN = ("DROP INDEX {s}.jobs_due_idx; DROP INDEX {s}.jobs_finished_idx; "
        "CREATE INDEX jobs_finished_brin ON {s}.jobs USING brin (finished_at) "
        "WHERE state IN ('succeeded', 'cancelled', 'dead'); ")

# The running indexes before migration 0010: two, both holding lease_expires_at (the
# claim inserts into both, a renewal is never HOT). For a before/after in one run.
TWO_RUNNING_INDEXES = ("DROP INDEX {s}.jobs_running_idx; "
                       "CREATE INDEX jobs_lease_expiry_idx ON {s}.jobs (lease_expires_at) WHERE state = 'running'; "
                       "CREATE INDEX jobs_running_idx ON {s}.jobs (queue, lease_expires_at) "
                       "WHERE state = 'running'; ")

# The seeds' one-statement claim on pgworker's table, with pgworker's SET list and RETURNING
# (no gate, no aging arm, no priority walk, no final sort): what the claim statement's own
# machinery costs, apart from the table's indexes. Its rows have the claim's shape.
SIMPLE_CLAIM = """
WITH c AS (
    SELECT id FROM {schema}.jobs
    WHERE queue = %(queue)s AND state = 'pending' AND NOT blocked AND run_at <= now()
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs AS j
SET state = 'running', attempts = j.attempts + 1, lease_token = j.lease_token + 1, lease_owner = %(owner)s,
    lease_expires_at = statement_timestamp() + make_interval(secs => %(lease_seconds)s::float8),
    started_at = statement_timestamp(), heartbeat_at = statement_timestamp(), cancel_requested_at = NULL
FROM c WHERE j.id = c.id
RETURNING NULL::boolean, NULL::boolean, NULL::integer, NULL::float8,
          NULL::timestamptz, NULL::bigint, NULL::boolean, NULL::bigint, NULL::float8, NULL::timestamptz, j.id, j.queue, j.task, j.payload, j.priority,
          j.attempts, j.max_attempts, j.lease_token, j.lease_expires_at, j.run_at, j.created_at, j.trace_context,
          j.ordering_key, j.dedupe_key, extract(epoch FROM statement_timestamp() - j.run_at)::float8
"""
CLAIM_STATEMENTS = {"today-simple-claim": SIMPLE_CLAIM, "lean-ff50-simple-claim": SIMPLE_CLAIM}

# name: (description, DDL run after pgworker's migration; {s} = the schema)
VARIANTS: dict[str, tuple[str, str]] = {
    "today-simple-claim": ("today's schema, the seeds' simple claim statement (SIMPLE_CLAIM)", ""),
    "today-aged-skip": ("today's schema; the claim's aging arm skipped without a bound", ""),
    "today": ("pgworker's schema as migrated (one running index, fillfactor 70)", ""),
    "before-0010": ("the schema before migration 0010: two running indexes holding lease_expires_at, "
                    "no fillfactor", TWO_RUNNING_INDEXES + "ALTER TABLE {s}.jobs RESET (fillfactor);"),
    "two-running-indexes": ("the running indexes before migration 0010, today's fillfactor (70)",
                            TWO_RUNNING_INDEXES),
    "today-ff100": ("today's indexes, no fillfactor (the default, 100)", "ALTER TABLE {s}.jobs RESET (fillfactor);"),
    "today-ff95": ("today's schema, fillfactor 95", "ALTER TABLE {s}.jobs SET (fillfactor = 95);"),
    "today-ff90": ("today's schema, fillfactor 90 (room for a few renewals per page)",
                   "ALTER TABLE {s}.jobs SET (fillfactor = 90);"),
    "today-ff80": ("today's schema, fillfactor 80", "ALTER TABLE {s}.jobs SET (fillfactor = 80);"),
    "today-ff50": ("today's schema, fillfactor 50 (room for a new version of every row of a page)",
                   "ALTER TABLE {s}.jobs SET (fillfactor = 50);"),
    "lean": ("today's schema (fillfactor 70) without jobs_due_idx (the claim's aging arm and the due counts "
             "on jobs_claim_idx) and jobs_finished_idx (retention by a BRIN index on finished_at)", LEAN),
    "lean-ff50": (
        "lean, with fillfactor 50: room on each page for a job's next versions (same-page updates: no "
        "cross-page lock record, prefix/suffix-compressed WAL, renewals HOT)",
        LEAN + "ALTER TABLE {s}.jobs SET (fillfactor = 50);"),
    "lean-ff50-simple-claim": ("lean-ff50 with SIMPLE_CLAIM", LEAN + "ALTER TABLE {s}.jobs SET (fillfactor = 50);"),
    "lean-ff85": ("lean, fillfactor 85", LEAN + "ALTER TABLE {s}.jobs SET (fillfactor = 85);"),
}


def _ensure_walinspect(conn: psycopg.Connection) -> None:
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")


def _lsn(conn: psycopg.Connection) -> str:
    return conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]


def _wal(conn: psycopg.Connection, start: str, end: str, xids: list[int], names: dict[int, str]) -> dict[str, Any]:
    rows = conn.execute("SELECT resource_manager, record_type, record_length, fpi_length, block_ref "
                        "FROM pg_get_wal_records_info(%s::pg_lsn, least(%s::pg_lsn, pg_current_wal_flush_lsn())) "
                        "WHERE xid::text::bigint = ANY(%s)", [start, end, xids]).fetchall()
    out: dict[str, Any] = {"bytes": 0, "fpi_bytes": 0, "records": Counter(), "leaf_inserts": Counter()}
    for rm, rtype, length, fpi, block_ref in rows:
        out["bytes"] += length
        out["fpi_bytes"] += fpi
        kind = f"{rm}/{rtype.split()[0]}"
        out["records"][kind] += 1
        if rm == "Btree" and rtype.startswith("INSERT_LEAF") or rm == "Btree" and rtype.startswith("INSERT_POST"):
            m = re.search(r"rel \d+/\d+/(\d+)", block_ref or "")
            out["leaf_inserts"][names.get(int(m.group(1)), m.group(1)) if m else "?"] += 1
    return out


class Run:
    """One transition, batch by batch, on one connection: its WAL and CPU."""

    def __init__(self, conn: psycopg.Connection, schema: str) -> None:
        self.conn = conn
        self.schema = schema
        self.names = {fn: name for fn, name in conn.execute(
            "SELECT c.relfilenode, c.relname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s", [schema]).fetchall()}

    def measure(self, jobs: int, step: Callable[[], int]) -> dict[str, Any]:
        """``step()`` runs one batch in the open transaction and returns the jobs it moved."""
        conn, xids, done = self.conn, [], 0
        start, cpu0 = _lsn(conn), cpu_seconds(conn.info.backend_pid)
        while done < jobs:
            with conn.transaction():
                xids.append(conn.execute("SELECT txid_current()").fetchone()[0])
                n = step()
            if not n:
                break
            done += n
        cpu = cpu_seconds(conn.info.backend_pid) - cpu0
        w = _wal(conn, start, _lsn(conn), [x % 2**32 for x in xids], self.names)
        per = lambda v: round(v / done, 2) if done else 0.0  # noqa: E731
        # the table's size after the transition: what free space kept for HOT costs
        heap = conn.execute("SELECT pg_relation_size(%s::regclass)",
                            [sql.Identifier(self.schema, "jobs").as_string(conn)]).fetchone()[0]
        return {"jobs": done, "heap_bytes_after": heap, "wal_bytes_per_job": per(w["bytes"] - w["fpi_bytes"]),
                "wal_bytes_per_job_with_fpi": per(w["bytes"]), "cpu_us_per_job": per(1e6 * cpu),
                "records_per_job": {k: per(v) for k, v in sorted(w["records"].items())},
                "index_entries_per_job": {k: per(v) for k, v in sorted(w["leaf_inserts"].items())}}


def pgworker_transitions(dsn: str, variant: str, jobs: int, batch: int, renewals: int = 1) -> dict[str, Any]:
    schema = f"pgworker_bench_tc_{variant.replace('-', '_')}"
    out: dict[str, Any] = {}
    with connect(dsn) as conn:
        _ensure_walinspect(conn)
        drop_schema(conn, schema)
        migrate(conn, schema)
        ddl = VARIANTS[variant][1]
        if ddl:
            conn.execute(sql.SQL(ddl).format(s=sql.Identifier(schema)))
        conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(sql.Identifier(schema, "jobs")))
        store, run = Store(schema), Run(conn, schema)  # autocommit: each batch's transaction() is a real one
        q = dict(store.queries)
        if variant in CLAIM_STATEMENTS:
            q["job_claim"] = sql.SQL(CLAIM_STATEMENTS[variant].replace("{schema}", "{s}")).format(
                s=sql.Identifier(schema)).as_string(conn)
        for old, new in CLAIM_CHANGES.get(variant, []):
            assert old in q["job_claim"], f"{variant}: job_claim changed; update CLAIM_CHANGES"
            q["job_claim"] = q["job_claim"].replace(old, new)
        jobs_table = sql.Identifier(schema, "jobs")
        ins = sql.SQL("INSERT INTO {} (queue, task, payload) SELECT %s, 'noop', '{{}}' "
                      "FROM generate_series(1, %s)").format(jobs_table)
        out["enqueue (multi-row INSERT)"] = run.measure(jobs, lambda: conn.execute(ins, [QUEUE, batch]).rowcount)
        conn.execute(sql.SQL("ANALYZE {}").format(jobs_table))  # as the benchmark's fill does
        claimed: list[tuple[int, int]] = []
        params = {"queue": QUEUE, "limit": batch, "owner": "tc", "lease_seconds": 60.0, "aging_seconds": None,
                  "locked": False, **NO_FLOORS}

        def claim() -> int:
            rows = [r for r in conn.execute(q["job_claim"], params).fetchall() if r[CLAIM_ID_COLUMN] is not None]
            claimed.extend((r[CLAIM_ID_COLUMN], r[CLAIM_TOKEN_COLUMN]) for r in rows)
            return len(rows)

        out["claim"] = run.measure(jobs, claim)
        leases = list(claimed)

        def batches(fn: Callable[[list[tuple[int, int]]], int]) -> Callable[[], int]:
            it = iter(range(0, len(leases), batch))

            def step() -> int:
                i = next(it, None)
                return 0 if i is None else fn(leases[i:i + batch])
            return step

        def renew(part: list[tuple[int, int]]) -> int:
            return len(conn.execute(q["job_renew"], {"ids": [a for a, _ in part], "tokens": [b for _, b in part],
                                                     "lease_seconds": 60.0}).fetchall())

        def complete(part: list[tuple[int, int]]) -> int:
            return len(conn.execute(q["job_complete"], {"ids": [a for a, _ in part],
                                                        "tokens": [b for _, b in part],
                                                        "has_result": [False] * len(part),
                                                        "results": [None] * len(part),
                                                        "results_channel": results_channel(schema)}).fetchall())

        # a long job's later renewals show the steady state: a first renewal finds its page
        # as the claim left it, a later one the page its previous version was put on
        for i in range(renewals):
            out["renew" if i == 0 else f"renew {i + 1}"] = run.measure(jobs, batches(renew))
        out["complete"] = run.measure(jobs, batches(complete))
        drop_schema(conn, schema)
    return out


def reference_transitions(dsn: str, jobs: int, batch: int) -> dict[str, Any]:
    schema = "pgworker_bench_tc_ref"
    s = sql.Identifier(schema)
    out: dict[str, Any] = {}
    with connect(dsn) as conn:
        _ensure_walinspect(conn)
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(s))
        conn.execute(sql.SQL(REF_DDL).format(s=s))
        conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(sql.Identifier(schema, "jobs")))
        run = Run(conn, schema)
        ins = sql.SQL("INSERT INTO {}.jobs (queue_name, payload) SELECT %s, '{{}}' FROM generate_series(1, %s)").format(s)
        out["enqueue (multi-row INSERT)"] = run.measure(jobs, lambda: conn.execute(ins, [QUEUE, batch]).rowcount)
        conn.execute(sql.SQL("ANALYZE {}.jobs").format(s))
        claimed: list[tuple[int, int]] = []
        claim_q, complete_q = sql.SQL(REF_CLAIM).format(s=s), sql.SQL(REF_COMPLETE).format(s=s)

        def claim() -> int:
            rows = conn.execute(claim_q, {"queue": QUEUE, "limit": batch, "owner": "tc"}).fetchall()
            claimed.extend((r[0], r[1]) for r in rows)
            return len(rows)

        out["claim"] = run.measure(jobs, claim)
        it = iter(range(0, len(claimed), batch))

        def complete() -> int:
            i = next(it, None)
            if i is None:
                return 0
            part = claimed[i:i + batch]
            return conn.execute(complete_q, {"ids": [a for a, _ in part], "tokens": [b for _, b in part],
                                             "owner": "tc"}).rowcount

        out["complete"] = run.measure(jobs, complete)
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(s))
    return out


def _median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per transition, the median of each number over the rounds (nested dicts too)."""
    import statistics

    def merge(values: list[Any]) -> Any:
        if isinstance(values[0], dict):
            keys = {k for v in values for k in v}
            return {k: merge([v.get(k, 0) for v in values]) for k in sorted(keys)}
        return statistics.median(values)

    return merge(runs)


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| variant | transition | WAL B/job (no FPI) | with FPI | backend CPU µs/job | index entries per job | "
             "heap records per job | table kB after |", "|---|---|---:|---:|---:|---|---|---:|"]
    for variant, transitions in results.items():
        for name, r in transitions.items():
            entries = ", ".join(f"{k} {v:g}" for k, v in r["index_entries_per_job"].items()) or "none"
            heap = ", ".join(f"{k} {v:g}" for k, v in r["records_per_job"].items() if k.startswith("Heap"))
            lines.append(f"| {variant} | {name} | {r['wal_bytes_per_job']:,.0f} | {r['wal_bytes_per_job_with_fpi']:,.0f} | "
                         f"{r['cpu_us_per_job']:,.1f} | {entries} | {heap} | {r.get('heap_bytes_after', 0) / 1024:,.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default=LOCAL_DSN)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--variant", default="ref,today", help=f"comma-separated: ref, {', '.join(VARIANTS)}")
    p.add_argument("--renewals", type=int, default=1,
                   help="renewals of every lease between the claim and the completion (0: none, as a no-op job)")
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds over every variant (interleaved, so a neighbour's load hurts all alike); "
                        "the median of each figure is shown")
    p.add_argument("--json")
    a = p.parse_args(argv)
    names = [x.strip() for x in a.variant.split(",") if x.strip()]
    rounds: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for _ in range(a.repeat):
        for v in names:
            rounds[v].append(reference_transitions(a.dsn, a.jobs, a.batch) if v == "ref"
                             else pgworker_transitions(a.dsn, v, a.jobs, a.batch, a.renewals))
    results = {v: _median_of(rs) for v, rs in rounds.items()}
    print(table(results))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
