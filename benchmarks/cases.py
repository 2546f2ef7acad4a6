"""One function per measurement. Each builds its own schema, measures once, and returns
plain numbers; ``run.py`` repeats them, takes medians and builds the table."""

from __future__ import annotations

import random
import time
from typing import Any

from pgworker import App, Settings

from . import ceiling
from .common import QUEUE, TASK, BenchSchema, connect, percentile, rate, wait_for
from .plain_loop import plain_loop
from .drain_runs import Observability, Service, drain


def sql_ceiling(dsn: str, *, clients: int, batch: int, jobs: int) -> dict[str, float]:
    return ceiling.claim_ceiling(dsn, batch=batch, clients=clients, jobs=jobs)


def plain(dsn: str, *, clients: int, batch: int, jobs: int) -> dict[str, float]:
    with BenchSchema(dsn, "plain") as s:
        s.fill(jobs)
        n, seconds = plain_loop(s, processes=clients, batch=batch)
    return {"jobs_per_second": rate(n, seconds), "jobs": n}


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
    every PGSTAT_IDLE_INTERVAL), so the window starts after a settle and is long."""
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
