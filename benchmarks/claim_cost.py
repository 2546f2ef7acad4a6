"""The claim statement's server cost, variant against variant, in one interleaved run.

    python -m benchmarks.claim_cost [--dsn DSN] [--jobs 20000] [--batch 100]
        [--priorities 1] [--variant today,ref,...] [--plan-cache-mode MODE] [--json FILE]

Each variant gets its own scratch schema filled with ``--jobs`` due jobs (spread over
``--priorities`` priorities) and its own connection, prepared statements on (psycopg's
default threshold) and the server's plan_cache_mode unless ``--plan-cache-mode`` or the
variant (``SESSION``: today-generic, today-custom) sets it; ``today`` thus shows the
plan cache's own choice, which the table shows as generic/custom plans. Then, round by round, every variant claims one batch of ``--batch`` and
completes it (pgworker's job_complete; the reference its own), the variants' order
rotating each round, so a neighbour's load on a shared machine falls on all alike.
Per claim and per completion it reads the backend's CPU from /proc/<pid>/schedstat
(nanoseconds of CPU time, so one statement is measured, not 10 ms ticks). Every
``--explain-every``-th round a variant's claim runs under EXPLAIN (ANALYZE, BUFFERS,
TIMING OFF) instead: the shared buffers it touched (hits + reads, a count no
neighbour's load changes) and the executor's time. Prints, per variant, the medians:
claim CPU µs per call and per job, completion µs per job, buffers per claim.

Variants (``VARIANTS``) are text replacements in job_claim, for issue 23's experiments
(``x-*``: ablations, each dropping one part and its guarantee, to attribute the cost;
``t-*``: the same for the table, today's statements on a jobs table without its CHECK
constraints, some indexes or the dependency trigger, ``TABLE_VARIANTS``);
``simple`` is the seeds' one-statement claim on pgworker's table, ``ref`` the minimal
lease queue (benchmarks/reference.py). Needs a local server (/proc of its backends).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from typing import Any, Callable, cast

import psycopg
from psycopg import sql

from pgworker.store import Store
from pgworker.store.base import results_channel
from pgworker.store.lifecycle import CLAIM_ID_COLUMN, CLAIM_TOKEN_COLUMN, NO_FLOORS

from .common import LOCAL_DSN, QUEUE, BenchSchema
from .transition_costs import SIMPLE_CLAIM
from .reference import CLAIM as REF_CLAIM, COMPLETE as REF_COMPLETE, RefSchema

# name -> (description, [(old, new)] replacements in job_claim)
VARIANTS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "today": ("job_claim as shipped", []),
    # not a candidate (no gate, no aging, no priority walk, no sort): the floor any
    # restructuring of the statement could reach on pgworker's table
    "simple": ("transition_costs.SIMPLE_CLAIM: the seeds' one-statement claim on pgworker's table", []),
    # ablations (not candidates: each drops a guarantee), to attribute the statement's cost
    "x-no-aged": ("ablation: no aging arm at all", [(
        """    SELECT id
    FROM {s}.jobs
    WHERE queue = %(queue)s AND state = 'pending' AND NOT blocked
      AND run_at >= coalesce(%(floor_aged)s::timestamptz, '-infinity')
      AND run_at <= now() - make_interval(secs => (SELECT aging_seconds FROM gate))
    ORDER BY run_at
    LIMIT (SELECT n FROM allowance)
    FOR NO KEY UPDATE SKIP LOCKED""", "    SELECT NULL::bigint AS id WHERE %(floor_aged)s::timestamptz IS NULL AND false")]),
    "x-no-sort": ("ablation: no final ORDER BY", [(
        "ORDER BY c.aged DESC, CASE WHEN c.aged THEN c.run_at END, c.priority DESC, c.run_at, c.id", "")]),
    "x-no-retry": ("ablation: retry_after_seconds NULL", [(
        """       CASE WHEN a.rate_per_second IS NOT NULL
                 AND a.tokens - (SELECT count(*) FROM claimed) < 1""", """       CASE WHEN false""")]),
    "x-no-unblock": ("ablation: unblock_wait_seconds NULL", [(
        """CASE WHEN j.unblocked_at IS NOT NULL AND j.attempts = 1 THEN""", "CASE WHEN false THEN")]),
    "x-no-walk": ("ablation: ranked_top as one ordered scan, no priority walk (reads jobs scheduled later)", [(
        """    SELECT c.id
    FROM priorities AS p
    CROSS JOIN LATERAL (
        SELECT coalesce(f.at, %(floor_default)s::timestamptz, '-infinity') AS at, coalesce(f.id, 0) AS id
        FROM (VALUES (1)) AS one (x)
        LEFT JOIN floors AS f ON f.priority = p.priority
    ) AS fl
    CROSS JOIN LATERAL (
        SELECT id
        FROM {s}.jobs
        WHERE queue = %(queue)s AND state = 'pending' AND NOT blocked
          AND priority = p.priority AND run_at <= now()
          -- from the claimer's floor (pgworker/claim_floors.py), a position (run_at, id):
          -- the row comparison is the index condition that starts the scan there; the
          -- plain run_at bound beside it, which it implies, keeps the generic plan on
          -- this index (without it the planner took jobs_due_idx, across priorities)
          AND run_at >= fl.at AND (run_at, id) >= (fl.at, fl.id)
          AND id NOT IN (SELECT id FROM aged)
        ORDER BY run_at, id""", """    SELECT c.id
    FROM (
        SELECT id
        FROM {s}.jobs
        WHERE queue = %(queue)s AND state = 'pending' AND NOT blocked
          AND run_at <= now() AND %(floor_default)s::timestamptz IS NULL
          AND id NOT IN (SELECT id FROM aged)
        ORDER BY priority DESC, run_at, id""")]),
    "x-no-rest": ("ablation: no ranked_rest", [(
        "    UNION ALL SELECT id FROM ranked_rest))", "))")]),
}
# more ablations (docs/benchmarks.md, "The server's cost per statement"): the token bucket's CTE,
# the three parts a queue without a policy never runs, and the horizon's function call
VARIANTS["x-no-bucket"] = ("ablation: no bucket CTE (rate limits)", [("""), bucket AS (
    UPDATE {s}.queues AS q
    SET tokens = a.tokens - (SELECT count(*) FROM claimed),
        tokens_at = greatest(q.tokens_at, statement_timestamp())
    FROM allowance AS a
    WHERE q.name = %(queue)s AND q.rate_per_second IS NOT NULL AND %(locked)s::boolean
)""", ")")])
VARIANTS["x-plain"] = ("ablation: what a queue without aging or limits never runs: aging arm, retry_after, bucket", VARIANTS["x-no-aged"][1] + VARIANTS["x-no-retry"][1] + VARIANTS["x-no-bucket"][1])
VARIANTS["x-no-horizon"] = ("ablation: no claim_horizon", [("CROSS JOIN {s}.claim_horizon(%(queue)s) AS h", "CROSS JOIN (SELECT now() AS at, 0::bigint AS epoch, true AS granted) AS h")])
# Table ablations (not candidates: each drops a guarantee): today's statements on a jobs
# table without a part of the schema, to attribute the table's cost per transition (the
# CHECK constraints, evaluated at every update; the index entries of the running and
# finished sets; the partial indexes whose predicates every update evaluates; the
# dependency trigger's WHEN). SQL run on the filled schema ({s}: its quoted name).
_DROP_CHECKS = ("DO $$ DECLARE c text; BEGIN FOR c IN SELECT conname FROM pg_constraint "
                "WHERE conrelid = '{s}.jobs'::regclass AND contype = 'c' LOOP "
                "EXECUTE format('ALTER TABLE {s}.jobs DROP CONSTRAINT %I', c); END LOOP; END $$")
_DROP_RUNNING_FINISHED = "DROP INDEX {s}.jobs_running_idx; DROP INDEX {s}.jobs_finished_idx"
_DROP_PARTIALS = "; ".join(f"DROP INDEX {{s}}.{i}" for i in (
    "jobs_dead_idx", "jobs_dedupe_key_idx", "jobs_ordering_key_idx", "jobs_ordering_active_idx",
    "jobs_schedule_slot_idx", "jobs_graph_idx", "jobs_waiting_idx"))
_DROP_TRIGGER = "DROP TRIGGER jobs_dependencies_settle ON {s}.jobs"
TABLE_VARIANTS: dict[str, str] = {
    "t-no-checks": _DROP_CHECKS,
    "t-no-running-finished": _DROP_RUNNING_FINISHED,
    "t-no-running": "DROP INDEX {s}.jobs_running_idx",
    "t-no-other-partials": _DROP_PARTIALS,
    "t-no-trigger": _DROP_TRIGGER,
    "t-none-of-these": "; ".join((_DROP_CHECKS, _DROP_RUNNING_FINISHED, _DROP_PARTIALS, _DROP_TRIGGER)),
}
for _name in TABLE_VARIANTS:
    VARIANTS[_name] = (f"table ablation: today's statements, {_name[2:].replace('-', ' ')}", [])
WHOLE = {"simple": SIMPLE_CLAIM}
# variants that are another's statement on a connection with a setting: name -> (base, SET)
SESSION: dict[str, tuple[str, str]] = {
    "today-generic": ("today", "SET plan_cache_mode = force_generic_plan"),
    "today-custom": ("today", "SET plan_cache_mode = force_custom_plan"),
}


def backend_ns(pid: int) -> int:
    """CPU time of a local process in nanoseconds (/proc/<pid>/schedstat's first field)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def _buffers(plan: dict[str, Any]) -> int:
    """Shared buffers hit + read by a plan tree (the top node counts its children's)."""
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


class Subject:
    """One variant: its schema, connection and statements; claims and completes batches."""

    def __init__(self, dsn: str, name: str, jobs: int, priorities: int, batch: int,
                 plan_cache_mode: str | None = None) -> None:
        self.name, self.batch = name, batch
        self.samples: dict[str, list[float]] = {"claim_us": [], "claim_jobs": [], "complete_us": [],
                                                "buffers": [], "planning_buffers": [], "exec_ms": []}
        self.conn = psycopg.connect(dsn, autocommit=True, application_name="pgworker-bench:claim_cost")
        self.pid = self.conn.info.backend_pid
        self.prepared, self.plans = False, (0, 0)
        if name in SESSION:
            self.conn.execute(SESSION[name][1])
        elif plan_cache_mode and name != "ref":
            self.conn.execute(sql.SQL("SET plan_cache_mode = {}").format(sql.Identifier(plan_cache_mode)))
        self.schema_cm: Any = RefSchema(dsn) if name == "ref" else BenchSchema(dsn, f"cc_{name.replace('-', '_')}")
        self.schema_cm.__enter__()
        try:
            self._build(dsn, jobs, priorities)
        except BaseException:  # a variant that does not apply: its schema goes too
            self.close()
            raise

    def _build(self, dsn: str, jobs: int, priorities: int) -> None:
        name = self.name
        if name == "ref":
            self.schema_cm.fill(jobs)
            s = sql.Identifier(self.schema_cm.name)
            self.claim_q = sql.SQL(REF_CLAIM).format(s=s).as_string(self.conn)
            self.complete_q = sql.SQL(REF_COMPLETE).format(s=s).as_string(self.conn)
        else:
            self.schema_cm.fill(jobs)
            if priorities > 1:
                with psycopg.connect(dsn, autocommit=True) as c:
                    c.execute(sql.SQL("UPDATE {} SET priority = id %% %s").format(
                        sql.Identifier(self.schema_cm.name, "jobs")), [priorities])
                    c.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(self.schema_cm.name, "jobs")))
            q = dict(Store(self.schema_cm.name).queries)
            text = (sql.SQL(WHOLE[name].replace("{schema}", "{s}")).format(s=sql.Identifier(self.schema_cm.name))
                    .as_string(self.conn) if name in WHOLE else q["job_claim"])
            quoted = sql.Identifier(self.schema_cm.name).as_string(self.conn)
            for old, new in VARIANTS[SESSION[name][0] if name in SESSION else name][1]:
                old, new = old.replace("{s}", quoted), new.replace("{s}", quoted)
                assert old in text, f"{name}: job_claim changed; update VARIANTS"
                text = text.replace(old, new)
            self.claim_q, self.complete_q = text, q["job_complete"]
            self.channel = results_channel(self.schema_cm.name)
            if name in TABLE_VARIANTS:
                with psycopg.connect(dsn, autocommit=True) as c:
                    c.execute(TABLE_VARIANTS[name].replace("{s}", quoted))
                    c.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(self.schema_cm.name, "jobs")))

    def params(self) -> dict[str, Any]:
        if self.name == "ref":
            return {"queue": QUEUE, "limit": self.batch, "owner": "cc"}
        return {"queue": QUEUE, "limit": self.batch, "owner": "cc", "lease_seconds": 60.0,
                "aging_seconds": None, "locked": False, **NO_FLOORS}

    def _leases(self, rows: list[tuple[Any, ...]]) -> list[tuple[int, int]]:
        if self.name == "ref":
            return [(r[0], r[1]) for r in rows]
        return [(r[CLAIM_ID_COLUMN], r[CLAIM_TOKEN_COLUMN]) for r in rows if r[CLAIM_ID_COLUMN] is not None]

    def step(self, explain: bool) -> int:
        """Claim one batch and complete it; returns the jobs claimed (0: drained)."""
        conn = self.conn
        if explain:
            text = "EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) " + self.claim_q
            plan = self._explain(text)
            self.samples["buffers"].append(_buffers(plan["Plan"]))
            self.samples["planning_buffers"].append(_buffers(plan.get("Planning", {})))
            self.samples["exec_ms"].append(plan["Execution Time"])
            # EXPLAIN returns no rows: read back what it claimed, to complete it
            leases = self._claimed_by_explain()
        else:
            t0 = backend_ns(self.pid)
            rows = conn.execute(self.claim_q, self.params()).fetchall()
            dt = backend_ns(self.pid) - t0
            leases = self._leases(rows)
            if leases:
                self.samples["claim_us"].append(dt / 1000)
                self.samples["claim_jobs"].append(len(leases))
        if not leases:
            return 0
        t0 = backend_ns(self.pid)
        self._complete(leases)
        if not explain:
            self.samples["complete_us"].append((backend_ns(self.pid) - t0) / 1000 / len(leases))
        return len(leases)

    def _explain(self, text: str) -> dict[str, Any]:
        """The claim's EXPLAIN as its prepared executions are planned: a generic plan when
        the server made one for them (then through PREPARE and EXPLAIN EXECUTE under
        force_generic_plan; a plan cache that flipped to custom plans reads the same
        buffers), else a custom plan with the values bound."""
        conn = self.conn
        if not self.generic():
            row = conn.execute(text, self.params()).fetchone()
            assert row is not None
            return cast(dict[str, Any], row[0][0])
        names, body = self._numbered()
        if not self.prepared:
            conn.execute(sql.SQL("PREPARE cc_claim AS {}").format(sql.SQL(body)))
            self.prepared = True
        p = self.params()
        with conn.transaction():
            conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            args = sql.SQL(", ").join(sql.Literal(p[n]) for n in names)
            row = conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) EXECUTE cc_claim ({})")
                               .format(args)).fetchone()
            assert row is not None
            return cast(dict[str, Any], row[0][0])

    def _numbered(self) -> tuple[list[str], str]:
        """The claim with $n placeholders as psycopg sends it (numbered by first use)."""
        names: list[str] = []

        def number(m: re.Match[str]) -> str:
            if m[1] not in names:
                names.append(m[1])
            return f"${names.index(m[1]) + 1}"
        return names, re.sub(r"%\((\w+)\)s", number, self.claim_q).replace("%%", "%")

    def generic(self) -> bool:
        """Whether the server runs this connection's prepared claim on a generic plan."""
        row = self.conn.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                                "WHERE statement = %s", [self._numbered()[1]]).fetchone()
        if row is not None:
            self.plans = (row[0], row[1])
        return bool(row and row[0] > 0)

    def _claimed_by_explain(self) -> list[tuple[int, int]]:
        if self.name == "ref":
            q = sql.SQL("SELECT id, lease_token FROM {} WHERE status = 'running'").format(
                sql.Identifier(self.schema_cm.name, "jobs"))
        else:
            q = sql.SQL("SELECT id, lease_token FROM {} WHERE state = 'running'").format(
                sql.Identifier(self.schema_cm.name, "jobs"))
        return [(a, b) for a, b in self.conn.execute(q).fetchall()]

    def _complete(self, leases: list[tuple[int, int]]) -> None:
        ids, tokens = [a for a, _ in leases], [b for _, b in leases]
        if self.name == "ref":
            self.conn.execute(self.complete_q, {"ids": ids, "tokens": tokens, "owner": "cc"})
        else:
            self.conn.execute(self.complete_q, {"ids": ids, "tokens": tokens, "has_result": [False] * len(ids),
                                                "results": [None] * len(ids),
                                                "results_channel": self.channel}).fetchall()

    def summary(self) -> dict[str, float]:
        s = self.samples
        med: Callable[[list[float]], float] = lambda v: round(statistics.median(v), 2) if v else 0.0  # noqa: E731
        per_job = [us / n for us, n in zip(s["claim_us"], s["claim_jobs"])]
        return {"claims": len(s["claim_us"]), "claim_us_per_call": med(s["claim_us"]),
                "claim_us_per_job": med(per_job), "complete_us_per_job": med(s["complete_us"]),
                "claim_plus_complete_us_per_job": round(med(per_job) + med(s["complete_us"]), 2),
                "buffers_per_claim": med(s["buffers"]), "planning_buffers": med(s["planning_buffers"]),
                "explain_exec_ms": med(s["exec_ms"]), "generic_plans": self.plans[0],
                "custom_plans": self.plans[1]}

    def close(self) -> None:
        self.conn.close()
        self.schema_cm.__exit__(None, None, None)


def run(dsn: str, names: list[str], jobs: int, batch: int, priorities: int, explain_every: int,
        plan_cache_mode: str | None = None) -> dict[str, dict[str, float]]:
    subjects: list[Subject] = []
    try:
        for n in names:  # inside the try: a variant that fails to build drops the schemas made
            subjects.append(Subject(dsn, n, jobs, priorities, batch, plan_cache_mode))
        live, r = list(subjects), 0
        while live:
            order = live[r % len(live):] + live[:r % len(live)]
            for s in order:
                if not s.step(explain=explain_every > 0 and r % explain_every == explain_every - 1):
                    live.remove(s)
            r += 1
        for s in subjects:
            s.generic()
        return {s.name: s.summary() for s in subjects}
    finally:
        for s in subjects:
            s.close()


def table(results: dict[str, dict[str, float]]) -> str:
    lines = ["| variant | claims | claim µs/call | claim µs/job | complete µs/job | claim+complete µs/job | "
             "buffers/claim | planning buffers | EXPLAIN exec ms | generic/custom plans |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for v, r in results.items():
        lines.append(f"| {v} | {r['claims']:.0f} | {r['claim_us_per_call']:,.0f} | {r['claim_us_per_job']:.2f} | "
                     f"{r['complete_us_per_job']:.2f} | {r['claim_plus_complete_us_per_job']:.2f} | "
                     f"{r['buffers_per_claim']:,.0f} | {r['planning_buffers']:,.0f} | {r['explain_exec_ms']:.3f} | "
                     f"{r['generic_plans']:.0f}/{r['custom_plans']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default=LOCAL_DSN)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--priorities", type=int, default=1)
    p.add_argument("--explain-every", type=int, default=5)
    p.add_argument("--variant", default="ref,today", help=f"comma-separated: ref, {', '.join(VARIANTS)}")
    p.add_argument("--plan-cache-mode", choices=["auto", "force_generic_plan", "force_custom_plan"],
                   help="set on every pgworker variant's connection (not ref's): the ablations compare "
                        "executions, not a plan cache's choice between them")
    p.add_argument("--json")
    a = p.parse_args(argv)
    names = [x.strip() for x in a.variant.split(",") if x.strip()]
    results = run(a.dsn, names, a.jobs, a.batch, a.priorities, a.explain_every, a.plan_cache_mode)
    print(table(results))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
