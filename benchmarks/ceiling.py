"""The SQL ceiling: pgbench running pgworker's own statements on pgworker's own table.

The scripts are rendered from ``pgworker/sql/queries/*.sql`` at run time (one source of
truth): the claim is ``job_claim`` verbatim and the completion ``job_complete``
verbatim, each its own transaction, exactly as a claimer runs them. pgbench can carry a
value from one statement to the next only from a single row (``\\gset``), so the claim
runs inside a small PL/pgSQL function whose body is the ``job_claim`` text with its
``%(name)s`` parameters bound to the function's arguments; it folds the claimed rows'
ids and fencing tokens into two arrays, which the completion takes as its
``%(ids)s`` and ``%(tokens)s``. Static SQL in PL/pgSQL is prepared and its plan cached,
as psycopg's prepared statements are for pgworker. ``-M prepared`` for the same reason.

The enqueue baseline is ``job_insert`` verbatim (with its NOTIFY), and a plain
single-row ``INSERT`` beside it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from pgworker import sql as sqlfiles
from pgworker.store import notify_channel
from pgworker.store.base import results_channel

from .common import QUEUE, TASK, BenchSchema, connect
from .server_cost import BackendCpu, RunWal, wal_figures

PARAM = re.compile(r"%\((\w+)\)s")
# The claim's parameters and their SQL types: a new parameter in job_claim must be
# named here (the benchmark then fails with this message rather than measuring
# something else).
CLAIM_ARG_TYPES = {"queue": "text", "limit": "integer", "owner": "text", "lease_seconds": "float8",
                   "aging_seconds": "float8", "locked": "boolean", "floor_priorities": "smallint[]",
                   "floor_at": "timestamptz[]", "floor_id": "bigint[]", "floor_default": "timestamptz", "floor_aged": "timestamptz"}
# As pgworker's store passes them for a queue without policies: no aging bound, the
# plain (unlocked) form of the claim, no floors (every scan from the start, as App.claim).
CLAIM_ARG_VALUES = {"queue": sql.Literal(QUEUE), "owner": sql.SQL("'pgbench:' || :client_id::text"),
                    "lease_seconds": sql.Literal(60.0), "aging_seconds": sql.SQL("NULL::float8"),
                    "locked": sql.SQL("false"), "floor_priorities": sql.SQL("NULL::smallint[]"),
                    "floor_at": sql.SQL("NULL::timestamptz[]"), "floor_id": sql.SQL("NULL::bigint[]"),
                    "floor_default": sql.SQL("NULL::timestamptz"),
                    "floor_aged": sql.SQL("NULL::timestamptz")}
LEASE_SECONDS = 60.0


def pgbench_path() -> str:
    """pgbench from PATH or the PostgreSQL install; raises SystemExit naming the fix."""
    found = shutil.which("pgbench") or next(
        (p for p in ("/usr/bin/pgbench", "/usr/local/bin/pgbench") if os.path.exists(p)), None)
    if found is None:
        raise SystemExit("benchmark: pgbench not found; install it (Debian: apt-get install "
                         "postgresql-client) or put it on PATH")
    return found


def _params(text: str) -> list[str]:
    return list(dict.fromkeys(PARAM.findall(text)))


def claim_function_sql(schema: str) -> str:
    """CREATE FUNCTION <schema>.bench_claim(...) whose body is job_claim verbatim."""
    body = sqlfiles.render(sqlfiles.query_templates()["job_claim"], schema)
    names = _params(body)
    unknown = [n for n in names if n not in CLAIM_ARG_TYPES]
    if unknown:
        raise SystemExit(f"benchmark: job_claim has parameters the pgbench ceiling does not know: "
                         f"{unknown}; add their types to benchmarks/ceiling.py CLAIM_ARG_TYPES")
    body = PARAM.sub(lambda m: f"p_{m.group(1)}", body)
    args = ", ".join(f"p_{n} {CLAIM_ARG_TYPES[n]}" for n in names)
    fn = sql.Identifier(schema, "bench_claim").as_string(None)
    return (f"CREATE FUNCTION {fn}({args}, OUT ids bigint[], OUT tokens bigint[])\n"
            "LANGUAGE plpgsql AS $bench$\nDECLARE bench_row record;\nBEGIN\n"
            "  ids := '{}'; tokens := '{}';\n"
            f"  FOR bench_row IN\n{body}\n  LOOP\n"
            "    IF bench_row.id IS NOT NULL THEN\n"
            "      ids := ids || bench_row.id; tokens := tokens || bench_row.lease_token;\n    END IF;\n"
            "  END LOOP;\nEND\n$bench$")


def claim_complete_script(schema: str, batch: int) -> str:
    """The pgbench script of one claim transaction and one completion transaction."""
    names = _params(sqlfiles.query_templates()["job_claim"])
    values = {**CLAIM_ARG_VALUES, "limit": sql.Literal(batch)}
    call = sql.SQL("SELECT ids, tokens FROM {}({}) \\gset").format(
        sql.Identifier(schema, "bench_claim"),
        sql.SQL(", ").join(sql.SQL("{} => {}").format(sql.Identifier(f"p_{n}"), values[n]) for n in names))
    complete = sqlfiles.render(sqlfiles.query_templates()["job_complete"], schema)
    extra = [n for n in _params(complete) if n not in ("ids", "tokens", "has_result", "results", "results_channel")]
    if extra:
        raise SystemExit(f"benchmark: job_complete has parameters the pgbench ceiling does not know: {extra}")
    # no-op jobs return nothing: no result rows (issue 21), as the claimer sends it
    complete = (complete.replace("%(has_result)s", "(SELECT array_agg(false) FROM unnest(:ids::bigint[]))")
                .replace("%(results)s", "(SELECT array_agg(NULL::text) FROM unnest(:ids::bigint[]))")
                .replace("%(results_channel)s", sql.Literal(results_channel(schema)).as_string(None))
                .replace("%(ids)s", ":ids").replace("%(tokens)s", ":tokens"))
    return f"{call.as_string(None)}\n{_strip_comments(complete)};\n"


def insert_script(schema: str) -> str:
    """job_insert verbatim with a no-op job's values (due now, so it NOTIFYs)."""
    text = sqlfiles.render(sqlfiles.query_templates()["job_insert"], schema)
    values: dict[str, Any] = {
        "queue": QUEUE, "task": TASK, "payload": "{}", "priority": 0, "run_at": None, "delay": 0.0,
        "max_attempts": 5, "dedupe_key": None, "dedupe_window": None, "ordering_key": None,
        "dead_blocks_key": True, "trace_context": None,
        "channel": notify_channel(schema), "notify_payload": QUEUE}
    unknown = [n for n in _params(text) if n not in values]
    if unknown:
        raise SystemExit(f"benchmark: job_insert has parameters the pgbench baseline does not know: {unknown}")
    text = PARAM.sub(lambda m: sql.Literal(values[m.group(1)]).as_string(None), text)
    return _strip_comments(text) + ";\n"


def plain_insert_script(schema: str) -> str:
    return sql.SQL("INSERT INTO {} (queue, task, payload) VALUES ({}, {}, '{{}}');\n").format(
        sql.Identifier(schema, "jobs"), sql.Literal(QUEUE), sql.Literal(TASK)).as_string(None)


def _strip_comments(text: str) -> str:
    """The statement without its comments: pgbench takes any ``:name`` in the text,
    comments included (``/* pgworker:job_complete */``), for a variable."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--")).strip()


@dataclass
class PgbenchResult:
    tps: float
    transactions: int
    latency_ms: float
    statement_ms: list[float]
    backend_cpu: float = 0.0  # CPU seconds of pgbench's backends (with a sampler)


def run_pgbench(dsn: str, script: str, *, clients: int, transactions: int | None = None,
                seconds: float | None = None, sampler: Any = None) -> PgbenchResult:
    """Run pgbench (-M prepared, -n: no vacuum of pgbench's own tables) and parse it.
    ``sampler``: a class like :class:`benchmarks.server_cost.BackendCpu`, made with
    (dsn, pgbench's pid) and sampled while it runs, for its backends' CPU."""
    import time

    with tempfile.NamedTemporaryFile("w", suffix=".sql", prefix="pgworker-bench-", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        cmd = [pgbench_path(), "-n", "-M", "prepared", "-r", "-f", path, "-c", str(clients),
               "-j", str(clients)]
        cmd += ["-t", str(transactions)] if transactions is not None else ["-T", str(max(1, round(seconds or 5)))]
        cmd.append(dsn)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        cpu = None
        try:
            if sampler is not None:
                cpu = sampler(dsn, proc.pid)
                deadline = time.monotonic() + 900
                while proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                    cpu.sample()
            out, err = proc.communicate(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
            if cpu is not None:
                cpu.close()
    finally:
        os.unlink(path)
    if proc.returncode != 0:
        raise RuntimeError(f"pgbench failed ({proc.returncode}): {err.strip()[:1500]}")
    result = parse_pgbench(out)
    result.backend_cpu = cpu.seconds if cpu is not None else 0.0
    return result


def parse_pgbench(out: str) -> PgbenchResult:
    tps = float(re.search(r"^tps = ([\d.]+)", out, re.M).group(1))  # type: ignore[union-attr]
    done = int(re.search(r"actually processed: (\d+)", out).group(1))  # type: ignore[union-attr]
    lat = re.search(r"^latency average = ([\d.]+) ms", out, re.M)
    stmts: list[float] = []
    after = out.split("statement latencies in milliseconds", 1)
    if len(after) == 2:
        for line in after[1].splitlines()[1:]:
            m = re.match(r"\s+([\d.]+)\s", line)
            if m:
                stmts.append(float(m.group(1)))
    return PgbenchResult(tps, done, float(lat.group(1)) if lat else 0.0, stmts)


def claim_ceiling(dsn: str, *, batch: int, clients: int, jobs: int, finished: int = 0) -> dict[str, float]:
    """jobs/s of pgbench claiming ``batch`` at a time with ``clients`` connections,
    draining about ``jobs`` due jobs (plus a warm-up of a tenth), on a fresh schema
    that also keeps ``finished`` succeeded jobs."""
    per_client = max(2, jobs // (clients * batch))
    warm = max(1, per_client // 10)
    with BenchSchema(dsn, "pgbench") as s:
        with connect(dsn) as conn:
            conn.execute(claim_function_sql(s.name))
        s.fill(clients * batch * (per_client + warm), finished=finished)
        script = claim_complete_script(s.name, batch)
        run_pgbench(dsn, script, clients=clients, transactions=warm)
        wal = RunWal(dsn, s.name)
        r = run_pgbench(dsn, script, clients=clients, transactions=per_client, sampler=BackendCpu)
        lsn, own = wal.finish()
        counts = s.counts()
    if counts.get("succeeded", 0) != finished + clients * batch * (per_client + warm):
        raise RuntimeError(f"pgbench ceiling: expected every job to succeed, got {counts}")
    n = clients * batch * per_client
    return {"jobs_per_second": r.tps * batch, "claim_ms": r.statement_ms[0] if r.statement_ms else 0.0,
            "complete_ms": r.statement_ms[1] if len(r.statement_ms) > 1 else 0.0,
            "cpu_backends_us_per_job": round(1e6 * r.backend_cpu / n, 1), **wal_figures(lsn, own, n)}


def insert_ceiling(dsn: str, *, seconds: float, plain: bool = False, clients: int = 1) -> float:
    """Rows/s of pgbench's single-row inserts (job_insert verbatim, or a plain INSERT)."""
    with BenchSchema(dsn, "pgbench") as s:
        script = plain_insert_script(s.name) if plain else insert_script(s.name)
        run_pgbench(dsn, script, clients=clients, seconds=1)
        return run_pgbench(dsn, script, clients=clients, seconds=seconds).tps


def multirow_insert_ceiling(dsn: str, *, rows: int, seconds: float) -> float:
    """Rows/s of pgbench inserting ``rows`` rows per statement (one VALUES list, distinct
    payloads), one client, on pgworker's table."""
    with BenchSchema(dsn, "pgbench") as s:
        values = ", ".join(f"('{QUEUE}', '{TASK}', '{{\"i\": {i}}}')" for i in range(rows))
        script = sql.SQL("INSERT INTO {} (queue, task, payload) VALUES ").format(
            sql.Identifier(s.name, "jobs")).as_string(None) + values + ";\n"
        run_pgbench(dsn, script, clients=1, seconds=1)
        return rows * run_pgbench(dsn, script, clients=1, seconds=seconds).tps
