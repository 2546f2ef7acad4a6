"""One function per measurement. Each builds its own schema, measures once, and returns
plain numbers; ``run.py`` repeats them, takes medians and builds the table."""

from __future__ import annotations

import os
import random
import time
from typing import Any

import psycopg

from pgworker import App, Settings

from . import ceiling
from .common import QUEUE, TASK, BenchSchema, connect, percentile, rate, wait_for
from .plain_loop import plain_loop_costs
from .drain_runs import Observability, Service, drain


def sql_ceiling(dsn: str, *, clients: int, batch: int, jobs: int) -> dict[str, float]:
    return ceiling.claim_ceiling(dsn, batch=batch, clients=clients, jobs=jobs)


def plain(dsn: str, *, clients: int, batch: int, jobs: int) -> dict[str, float]:
    """The plain psycopg loop over ``jobs`` due jobs: its rate, CPU (its own, the
    server's) and WAL per job."""
    with BenchSchema(dsn, "plain") as s:
        s.fill(jobs)
        n, seconds, costs = plain_loop_costs(s, processes=clients, batch=batch)
    return {"jobs_per_second": rate(n, seconds), "jobs": n, **costs}


def pgworker_drain(dsn: str, *, clients: int, batch: int | None, jobs: int, finished: int = 0,
                   obs: Observability | None = None, code_root: str | None = None) -> dict[str, Any]:
    """``pgworker run --drain`` over ``jobs`` due jobs (``finished`` succeeded ones kept
    in the table besides); the rate from the rows, claim latency, memory, CPU.
    ``code_root``: run another checkout's pgworker (``--compare-with``)."""
    with BenchSchema(dsn, "drain", code_root=code_root) as s:
        s.fill(jobs, finished=finished)
        since = s.max_id() - jobs
        r = drain(s, concurrency=clients, batch=batch, obs=obs, since_id=since, code_root=code_root)
        left = s.counts().get("pending", 0)
    if r.jobs != jobs or left:
        raise RuntimeError(f"drain: {r.jobs} of {jobs} jobs succeeded, {left} pending left")
    return r.as_dict()


def _app(s: BenchSchema) -> App:
    return App(settings=Settings.from_env(environ={}, dsn=s.dsn, schema=s.name, tracing=True))


def enqueue_single(dsn: str, *, seconds: float) -> dict[str, float]:
    """``app.enqueue`` in a loop on one connection of the app's pool (each its own
    transaction, committed with the server's synchronous_commit)."""
    with BenchSchema(dsn, "enq") as s, _app(s) as app:
        for _ in range(200):  # warm-up: pool, prepared statements
            app.enqueue(TASK, {"i": 0}, queue=QUEUE)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(100):
                app.enqueue(TASK, {"i": n}, queue=QUEUE)
            n += 100
        elapsed = time.perf_counter() - t0
    return {"jobs_per_second": n / elapsed}


def enqueue_many(dsn: str, *, jobs: int, batch: int) -> dict[str, float]:
    """``app.enqueue_many`` in batches of ``batch`` (COPY, one NOTIFY per queue)."""
    with BenchSchema(dsn, "enq") as s, _app(s) as app:
        app.enqueue_many([(TASK, {"i": i}) for i in range(min(batch, 1000))])  # warm-up
        specs = [(TASK, {"i": i}) for i in range(batch)]
        n, t0 = 0, time.perf_counter()
        while n < jobs:
            app.enqueue_many(specs)
            n += batch
        elapsed = time.perf_counter() - t0
    return {"jobs_per_second": n / elapsed}


def insert_baseline(dsn: str, *, seconds: float, plain_insert: bool) -> dict[str, float]:
    return {"jobs_per_second": ceiling.insert_ceiling(dsn, seconds=seconds, plain=plain_insert)}


def wakeup_latency(dsn: str, *, listen: bool, jobs: int, mean_gap: float, poll_interval: float,
                   concurrency: int = 2, obs: Observability | None = None) -> dict[str, float]:
    """Enqueue-to-start latency of an idle worker: jobs enqueued one at a time at random
    moments (exponential gaps, mean ``mean_gap`` seconds), each measured as the claim's
    ``started_at`` minus the insert's ``created_at`` (both the database clock)."""
    rng = random.Random(6)
    with BenchSchema(dsn, "lat") as s, _app(s) as app:
        with Service(s, concurrency=concurrency, listen=listen, poll_interval=poll_interval, obs=obs):
            time.sleep(0.5)
            for _ in range(jobs):
                app.enqueue(TASK, {}, queue=QUEUE)
                time.sleep(rng.expovariate(1.0 / mean_gap))
            with connect(dsn) as conn:
                wait_for(lambda: s.q(conn, "SELECT count(*) FROM {s}.jobs WHERE state = 'succeeded'")[0][0] >= jobs,
                         120, "every latency job to run")
                waits = [r[0] * 1000.0 for r in s.q(
                    conn, "SELECT extract(epoch FROM started_at - created_at)::float8 FROM {s}.jobs")]
    return {"median_ms": percentile(waits, 50), "p99_ms": percentile(waits, 99), "max_ms": max(waits),
            "jobs": len(waits)}


def growth_ceiling(dsn: str, *, clients: int, due: int, finished: int) -> dict[str, float]:
    """pgbench at batch 100 draining ``due`` jobs with ``finished`` succeeded jobs kept."""
    return ceiling.claim_ceiling(dsn, batch=100, clients=clients,
                                 jobs=due, finished=finished)


def idle_fleet(dsn: str, *, pods: int, claimers: int, seconds: float, poll_interval: float = 2.0,
               code_root: str | None = None) -> dict[str, float]:
    """Statements per minute of an idle fleet: ``pods`` always-on ``pgworker run``
    (LISTEN, the default poll, reaper, pruner; no /metrics scrapes) of ``claimers`` each,
    on an empty queue, counted by the server (``pg_stat_database.xact_commit`` of the
    benchmark's database: every pgworker statement is its own transaction). Backends
    report their counts within about 10 s (PostgreSQL 15 flushes idle backends' statistics
    every PGSTAT_IDLE_INTERVAL), so the window starts after a settle and is long. The count
    is the database's, so the fleet runs in a database of its own when the role may create
    one (other sessions of a shared database would be counted too: ``own_database`` says
    which it was)."""
    from psycopg import conninfo, sql

    name = f"pgworker_bench_idle_{os.getpid()}"
    try:
        with connect(dsn) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        own = conninfo.make_conninfo(dsn, dbname=name)
    except psycopg.Error:
        own = None
    try:
        return {**_idle_fleet(own or dsn, pods=pods, claimers=claimers, seconds=seconds,
                              poll_interval=poll_interval, code_root=code_root), "own_database": own is not None}
    finally:
        if own is not None:
            with connect(dsn) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _idle_fleet(dsn: str, *, pods: int, claimers: int, seconds: float, poll_interval: float,
                code_root: str | None) -> dict[str, float]:
    with BenchSchema(dsn, "idle", code_root=code_root) as s:
        services = [Service(s, concurrency=claimers, listen=True, poll_interval=poll_interval, code_root=code_root)
                    for _ in range(pods)]
        try:
            for svc in services:
                svc.__enter__()
            time.sleep(15)  # start-up sweeps done, their statistics flushed
            with connect(dsn) as conn:
                count = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
                first = conn.execute(count).fetchone()[0]
                time.sleep(seconds)
                conn.execute("SELECT pg_stat_clear_snapshot()")
                last = conn.execute(count).fetchone()[0]
        finally:
            for svc in services:
                svc.__exit__(None, None, None)
    return {"statements_per_minute": (last - first - 2) * 60.0 / seconds, "pods": pods, "claimers": claimers}


def insert_plain_loop(dsn: str, *, seconds: float) -> dict[str, float]:
    """A plain psycopg single-row INSERT loop on pgworker's table (autocommit, prepared):
    the baseline of ``app.enqueue``."""
    from psycopg import sql

    with BenchSchema(dsn, "ins") as s, connect(dsn) as conn:
        conn.prepare_threshold = 0
        q = sql.SQL("INSERT INTO {} (queue, task, payload) VALUES (%s, %s, %s)").format(sql.Identifier(s.name, "jobs"))
        for i in range(200):
            conn.execute(q, (QUEUE, TASK, '{"i": 0}'))
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for i in range(100):
                conn.execute(q, (QUEUE, TASK, f'{{"i": {n + i}}}'))
            n += 100
        return {"jobs_per_second": n / (time.perf_counter() - t0)}


def insert_rows_baseline(dsn: str, *, rows: int, seconds: float) -> dict[str, float]:
    """pgbench running a ``rows``-row INSERT (one VALUES list) on pgworker's table, one
    client: the baseline of ``app.enqueue_many``. Rows per second."""
    return {"jobs_per_second": ceiling.multirow_insert_ceiling(dsn, rows=rows, seconds=seconds)}


def trap_drain(dsn: str, *, clients: int, due: int, trap: str, trap_rows: int,
               obs: Observability | None = None) -> dict[str, Any]:
    """A drain of ``due`` jobs beside a trap real queues fall into:

    - ``scheduled``: ``trap_rows`` jobs scheduled an hour from now, a third of them at a
      higher priority than the due ones;
    - ``finished``: ``trap_rows`` succeeded jobs kept in the table;
    - ``snapshot``: a REPEATABLE READ transaction in another session holds an old
      snapshot for the whole drain (dead row versions cannot be removed); the drain after
      it closes is measured too (``after_jobs_per_second``), and the dead tuples a VACUUM
      reclaims then (``dead_tuples_reclaimed``).
    """
    with BenchSchema(dsn, f"trap{trap[:4]}") as s:
        if trap == "scheduled":
            s.fill_later(trap_rows)
        s.fill(due, finished=trap_rows if trap == "finished" else 0)
        since = s.max_id() - due
        if trap != "snapshot":
            r = drain(s, concurrency=clients, batch=None, obs=obs, since_id=since)
            return {**r.as_dict(), "trap": trap}
        with connect(dsn) as holder:
            holder.autocommit = False
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            s.q(holder, "SELECT count(*) FROM {s}.jobs")  # take the snapshot now
            r = drain(s, concurrency=clients, batch=None, obs=obs, since_id=since)
            holder.rollback()
        s.fill(due)
        since2 = s.max_id() - due
        after = drain(s, concurrency=clients, batch=None, obs=obs, since_id=since2)
        before_vacuum = s.dead_tuples()
        with connect(dsn) as conn:
            s.q(conn, "VACUUM {s}.jobs")
        return {**r.as_dict(), "trap": trap, "after_jobs_per_second": round(after.rate, 1),
                "dead_tuples_reclaimed": before_vacuum - s.dead_tuples()}


def scale_out(dsn: str, *, pods: int, claimers: int, jobs: int, obs: Observability | None = None) -> dict[str, Any]:
    """``pods`` drain runs (``pgworker run --drain``, ``claimers`` each) started together
    on one schema; the rate from the rows."""
    from .drain_runs import drain_pods

    with BenchSchema(dsn, "pods") as s:
        s.fill(jobs)
        since = s.max_id() - jobs
        return drain_pods(s, pods=pods, concurrency=claimers, obs=obs, since_id=since)


def pgworker_drain_otlp(dsn: str, *, clients: int, jobs: int, ratio: float) -> dict[str, Any]:
    """The drain with pgworker's own OTLP set-up (SDK, batch span processor, OTLP/HTTP
    protobuf) exporting to the benchmark's local sink, sampling ``ratio`` of the jobs
    (parentbased_traceidratio): the rate, and the spans the sink received per job (below
    1 at 100 %: the batch processor dropped spans)."""
    from .otlp_sink import Sink

    try:
        import opentelemetry.exporter.otlp.proto.http  # noqa: F401
    except ImportError:
        raise RuntimeError("the OTLP case needs the OTLP exporter: pip install -e '.[otlp]' "
                           "(or '.[test]', which includes it)") from None
    with Sink() as sink:
        cpu0 = sink.cpu_seconds()
        r = pgworker_drain(dsn, clients=clients, batch=None, jobs=jobs,
                           obs=Observability("otlp", True, sampler_ratio=ratio, otlp_endpoint=sink.endpoint))
        stats = sink.stats()
        cpu = sink.cpu_seconds() - cpu0
    return {**r, "spans_per_job": round(stats["spans"] / jobs, 3), "otlp_requests": stats["requests"],
            "otlp_errors": stats["errors"], "cpu_sink_us_per_job": round(1e6 * cpu / jobs, 1)}


def enqueue_many_calls(dsn: str, *, batch: int, seconds: float) -> dict[str, float]:
    """``app.enqueue_many`` of ``batch`` jobs per call for about ``seconds``."""
    with BenchSchema(dsn, "enq") as s, _app(s) as app:
        specs = [(TASK, {"i": i}) for i in range(batch)]
        app.enqueue_many(specs[:min(batch, 1000)])  # warm-up
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            app.enqueue_many(specs)
            n += batch
        elapsed = time.perf_counter() - t0
    return {"jobs_per_second": n / elapsed}
