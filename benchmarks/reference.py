"""The minimal lease queue: the reference every issue-23 figure is a ratio to.

Its own table, in its own scratch schema: the seeds' columns (shared/seeds, "PostgreSQL
Job Queues Need Leases, Not Just SKIP LOCKED"), a primary key and ONE partial claim
index, nothing else. Its statements are the seeds' too: the one-statement claim (a
``FOR UPDATE SKIP LOCKED`` pick in a CTE and the UPDATE to running with a new fencing
token, committed at once) and the fenced completion (id + status + owner + token +
unexpired lease), batched over arrays. That is what a lease queue needs at the least; a
figure of pgworker's over the same figure of this, measured in the same run, is what
pgworker's extra guarantees cost.

Three drivers: a plain psycopg loop (N processes, autocommit, prepared statements),
pgbench scripts (the claim folds its rows into two arrays with ``\\gset``, the completion
takes them), and the enqueue baselines (a single-row INSERT loop, pgbench's 100-row INSERT).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

import psycopg
from psycopg import sql

from . import ceiling
from .common import QUEUE, _counter, connect
from .server_cost import BackendCpu, RunWal, own_backend_cpu, wal_figures

LEASE_SECONDS = 60

DDL = """
CREATE SCHEMA {s};
CREATE TYPE {s}.job_status AS ENUM ('pending', 'running', 'succeeded', 'dead');
CREATE TABLE {s}.jobs (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  queue_name text NOT NULL,
  payload jsonb NOT NULL,
  status {s}.job_status NOT NULL DEFAULT 'pending',
  priority integer NOT NULL DEFAULT 0,
  available_at timestamptz NOT NULL DEFAULT now(),
  attempt_count integer NOT NULL DEFAULT 0,
  max_attempts integer NOT NULL DEFAULT 8,
  lease_owner text,
  lease_token bigint NOT NULL DEFAULT 0,
  lease_expires_at timestamptz,
  last_error_code text,
  created_at timestamptz NOT NULL DEFAULT now(),
  finished_at timestamptz
);
CREATE INDEX jobs_claimable_idx ON {s}.jobs (queue_name, priority DESC, available_at, id)
  WHERE status = 'pending';
"""

# The seeds' claim, at a batch of %(limit)s; RETURNING what a worker needs to run and fence.
CLAIM = """
WITH candidate AS (
  SELECT id FROM {s}.jobs
  WHERE queue_name = %(queue)s AND status = 'pending' AND available_at <= now()
  ORDER BY priority DESC, available_at, id
  FOR UPDATE SKIP LOCKED
  LIMIT %(limit)s
)
UPDATE {s}.jobs AS j
SET status = 'running', attempt_count = attempt_count + 1, lease_owner = %(owner)s,
    lease_token = lease_token + 1, lease_expires_at = now() + interval '60 seconds'
FROM candidate
WHERE j.id = candidate.id
RETURNING j.id, j.lease_token, j.payload, j.attempt_count, j.max_attempts
"""

# The seeds' fenced completion, for a batch: zero rows for a job this worker no longer owns.
COMPLETE = """
UPDATE {s}.jobs AS j
SET status = 'succeeded', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS f(id, token)
WHERE j.id = f.id AND j.status = 'running' AND j.lease_owner = %(owner)s
  AND j.lease_token = f.token AND j.lease_expires_at > now()
"""

INSERT = "INSERT INTO {s}.jobs (queue_name, payload) VALUES (%s, %s)"


class RefSchema:
    """The reference table in a scratch schema of its own, dropped on exit."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.name = f"pgworker_bench_ref_{os.getpid()}_{next(_counter)}"

    def q(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(s=sql.Identifier(self.name))

    def __enter__(self) -> "RefSchema":
        with connect(self.dsn) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.name)))
            conn.execute(self.q(DDL))
        return self

    def __exit__(self, *exc: Any) -> None:
        with connect(self.dsn) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.name)))

    def fill(self, n: int) -> None:
        """``n`` pending jobs due now, then VACUUM ANALYZE (as pgworker's table is filled)."""
        with connect(self.dsn) as conn:
            for start in range(0, n, 200_000):
                conn.execute(self.q("INSERT INTO {s}.jobs (queue_name, payload, available_at) "
                                    "SELECT %s, '{{}}', now() - interval '1 second' FROM generate_series(1, %s)"),
                             [QUEUE, min(200_000, n - start)])
            conn.execute(self.q("VACUUM ANALYZE {s}.jobs"))

    def counts(self) -> dict[str, int]:
        with connect(self.dsn) as conn:
            return dict(conn.execute(self.q("SELECT status::text, count(*) FROM {s}.jobs GROUP BY 1")).fetchall())


def _consume(dsn: str, schema: str, batch: int, barrier: Any, out: Any) -> None:
    s = sql.Identifier(schema)
    claim, complete = sql.SQL(CLAIM).format(s=s), sql.SQL(COMPLETE).format(s=s)
    owner = f"ref:{os.getpid()}"
    with psycopg.connect(dsn, autocommit=True, application_name="pgworker-bench:ref") as conn:
        conn.prepare_threshold = 0
        cpu0 = own_backend_cpu(conn)
        barrier.wait()
        mine0 = time.process_time()
        n, last = 0, time.monotonic()
        while True:
            rows = conn.execute(claim, {"queue": QUEUE, "limit": batch, "owner": owner}).fetchall()
            if not rows:
                break
            done = conn.execute(complete, {"ids": [r[0] for r in rows], "tokens": [r[1] for r in rows],
                                           "owner": owner}).rowcount
            n += done
            last = time.monotonic()
        out.put((n, last, own_backend_cpu(conn) - cpu0, time.process_time() - mine0))


def loop(dsn: str, *, clients: int, batch: int, jobs: int) -> dict[str, float]:
    """The plain psycopg loop on the reference table over ``jobs`` due jobs: jobs/s (from
    the start gate to the last completion), its processes' CPU (all of it, start-up
    included; and ``cpu_loop``: from the start gate on), its backends' CPU and the WAL
    written, per job."""
    import resource

    with RefSchema(dsn) as s:
        s.fill(jobs)
        ctx = multiprocessing.get_context("spawn")
        barrier, out = ctx.Barrier(clients + 1), ctx.Queue()
        procs = [ctx.Process(target=_consume, args=(dsn, s.name, batch, barrier, out)) for _ in range(clients)]
        usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        for p in procs:
            p.start()
        wal = RunWal(dsn, s.name)
        barrier.wait(timeout=120)
        t0 = time.monotonic()
        results = [out.get(timeout=900) for _ in procs]
        lsn, own = wal.finish()
        for p in procs:
            p.join(60)
        usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        left = s.counts()
    n = sum(r[0] for r in results)
    if n != jobs or left.get("pending"):
        raise RuntimeError(f"reference loop: {n} of {jobs} jobs completed, {left}")
    seconds = max(r[1] for r in results) - t0
    client = (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime)
    return {"jobs_per_second": n / seconds, "jobs": n, "cpu_client_us_per_job": round(1e6 * client / n, 1),
            "cpu_backends_us_per_job": round(1e6 * sum(r[2] for r in results) / n, 1),
            "cpu_loop_us_per_job": round(1e6 * sum(r[3] for r in results) / n, 1), **wal_figures(lsn, own, n)}


def pgbench_script(schema: str, batch: int) -> str:
    """One claim transaction and one completion transaction, as a pgbench script."""
    s = sql.Identifier(schema).as_string(None)
    claim = (CLAIM.replace("{s}", s).replace("%(queue)s", f"'{QUEUE}'").replace("%(limit)s", str(batch))
             .replace("%(owner)s", "'pgbench:' || :client_id"))
    complete = (COMPLETE.replace("{s}", s).replace("%(ids)s", ":ids").replace("%(tokens)s", ":tokens")
                .replace("%(owner)s", "'pgbench:' || :client_id"))
    claim = " ".join(claim.split())
    return (f"WITH claimed AS ({claim}) SELECT array_agg(id) AS ids, array_agg(lease_token) AS tokens "
            f"FROM claimed \\gset\n{' '.join(complete.split())};\n")


def pgbench_drain(dsn: str, *, clients: int, batch: int, jobs: int) -> dict[str, float]:
    """pgbench running the reference claim and completion: jobs/s, its backends' CPU and
    the WAL, per job (a warm-up of a tenth first)."""
    per_client = max(2, jobs // (clients * batch))
    warm = max(1, per_client // 10)
    with RefSchema(dsn) as s:
        s.fill(clients * batch * (per_client + warm))
        script = pgbench_script(s.name, batch)
        ceiling.run_pgbench(dsn, script, clients=clients, transactions=warm)
        wal = RunWal(dsn, s.name)
        r = ceiling.run_pgbench(dsn, script, clients=clients, transactions=per_client, sampler=BackendCpu)
        lsn, own = wal.finish()
        counts = s.counts()
    n = clients * batch * per_client
    if counts.get("succeeded", 0) != clients * batch * (per_client + warm):
        raise RuntimeError(f"reference pgbench: expected every job to succeed, got {counts}")
    return {"jobs_per_second": r.tps * batch, "jobs": n, "claim_ms": r.statement_ms[0] if r.statement_ms else 0.0,
            "cpu_backends_us_per_job": round(1e6 * r.backend_cpu / n, 1), **wal_figures(lsn, own, n)}


def insert_loop(dsn: str, *, seconds: float) -> dict[str, float]:
    """The minimal single-row INSERT loop on the reference table (autocommit, prepared):
    the baseline of ``app.enqueue``."""
    with RefSchema(dsn) as s, connect(dsn) as conn:
        conn.prepare_threshold = 0
        q = s.q(INSERT)
        for _ in range(200):
            conn.execute(q, (QUEUE, '{"i": 0}'))
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for i in range(100):
                conn.execute(q, (QUEUE, f'{{"i": {n + i}}}'))
            n += 100
        return {"jobs_per_second": n / (time.perf_counter() - t0)}


def pgbench_insert_rows(dsn: str, *, rows: int, seconds: float) -> dict[str, float]:
    """pgbench inserting ``rows`` rows per statement (one VALUES list, distinct payloads)
    into the reference table, one client: the baseline of ``app.enqueue_many``. Rows/s."""
    with RefSchema(dsn) as s:
        values = ", ".join(f"('{QUEUE}', '{{\"i\": {i}}}')" for i in range(rows))
        script = s.q("INSERT INTO {s}.jobs (queue_name, payload) VALUES ").as_string(None) + values + ";\n"
        ceiling.run_pgbench(dsn, script, clients=1, seconds=1)
        return {"jobs_per_second": rows * ceiling.run_pgbench(dsn, script, clients=1, seconds=seconds).tps}
