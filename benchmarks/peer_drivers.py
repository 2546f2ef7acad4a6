"""Drain drivers for the peers, run with each peer's own virtualenv's Python.

    <venv>/bin/python benchmarks/peer_drivers.py pgqueuer|procrastinate --dsn DSN
        --schema NAME --jobs N --processes P [--batch B] [--concurrency C]

Prints one JSON line: {"jobs": done, "seconds": from the start gate to the end of the
last handler call in any process, "jobs_per_second": ..., "seconds_to_exit": to the last
process's exit}. Same shape as pgworker's drain: N no-op jobs enqueued in
bulk through the peer's public API into a schema of their own, then P worker processes,
started together behind a barrier, run until the queue is empty (each library's own
drain mode) and exit. The schema is dropped afterwards. This file imports only the peer
and psycopg/asyncpg, never pgworker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time
from typing import Any

import psycopg
from psycopg import sql


def _drop(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _create(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))


# -- PGQueuer -----------------------------------------------------------------------------

def _pgqueuer_env(schema: str) -> None:
    import os

    os.environ["PGQUEUER_SCHEMA"] = schema  # its tables, types and functions in our schema


async def _pgqueuer_setup(dsn: str, schema: str, jobs: int) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(dsn)
    try:
        q = Queries(AsyncpgDriver(conn))
        await q.install(create_schema=False)
        for start in range(0, jobs, 10_000):
            n = min(10_000, jobs - start)
            await q.enqueue(["noop"] * n, [None] * n, [0] * n)
    finally:
        await conn.close()


async def _pgqueuer_work(dsn: str, batch: int, barrier: Any, last: Any) -> None:
    from datetime import timedelta

    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint("noop")
    async def noop(job: Any) -> None:
        last.value = time.monotonic()

    await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
    try:
        await qm.run(batch_size=batch, mode=QueueExecutionMode.drain, dequeue_timeout=timedelta(seconds=0.5))
    finally:
        await conn.close()


def _pgqueuer_process(dsn: str, schema: str, batch: int, barrier: Any, last: Any) -> None:
    _pgqueuer_env(schema)
    asyncio.run(_pgqueuer_work(dsn, batch, barrier, last))


def _pgqueuer_left(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql.SQL("SELECT count(*) FROM {}.pgqueuer").format(sql.Identifier(schema))).fetchone()[0]


# -- Procrastinate ------------------------------------------------------------------------

def _procrastinate_app(dsn: str, schema: str, last: Any = None) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=dsn, kwargs={"options": f"-c search_path={schema}"}, min_size=1, max_size=4))

    @app.task(name="noop", queue="bench")
    async def noop() -> None:
        if last is not None:
            last.value = time.monotonic()

    return app


async def _procrastinate_setup(dsn: str, schema: str, jobs: int) -> None:
    app = _procrastinate_app(dsn, schema)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        task = app.tasks["noop"]
        for start in range(0, jobs, 5_000):
            await task.batch_defer_async(*({} for _ in range(min(5_000, jobs - start))))


async def _procrastinate_work(dsn: str, schema: str, concurrency: int, barrier: Any, last: Any) -> None:
    app = _procrastinate_app(dsn, schema, last)
    async with app.open_async():
        await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
        await app.run_worker_async(queues=["bench"], concurrency=concurrency, wait=False,
                                   install_signal_handlers=False)


def _procrastinate_process(dsn: str, schema: str, concurrency: int, barrier: Any, last: Any) -> None:
    import logging

    logging.disable(logging.WARNING)
    asyncio.run(_procrastinate_work(dsn, schema, concurrency, barrier, last))


def _procrastinate_left(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql.SQL("SELECT count(*) FROM {}.procrastinate_jobs WHERE status <> 'succeeded'")
                            .format(sql.Identifier(schema))).fetchone()[0]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("peer", choices=("pgqueuer", "procrastinate"))
    p.add_argument("--dsn", required=True)
    p.add_argument("--schema", required=True)
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--batch", type=int, default=10, help="PGQueuer batch_size")
    p.add_argument("--concurrency", type=int, default=1, help="Procrastinate concurrency per process")
    a = p.parse_args()
    _create(a.dsn, a.schema)
    try:
        if a.peer == "pgqueuer":
            _pgqueuer_env(a.schema)
            asyncio.run(_pgqueuer_setup(a.dsn, a.schema, a.jobs))
            target, args, left = _pgqueuer_process, (a.batch,), _pgqueuer_left
        else:
            asyncio.run(_procrastinate_setup(a.dsn, a.schema, a.jobs))
            target, args, left = _procrastinate_process, (a.concurrency,), _procrastinate_left
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(a.processes + 1)
        lasts = [ctx.RawValue("d", 0.0) for _ in range(a.processes)]
        procs = [ctx.Process(target=target, args=(a.dsn, a.schema, *args, barrier, last)) for last in lasts]
        for proc in procs:
            proc.start()
        barrier.wait(timeout=120)
        t0 = time.monotonic()
        for proc in procs:
            proc.join(900)
        exited = time.monotonic() - t0
        # to the end of the last handler call (CLOCK_MONOTONIC is one clock for every
        # process): the peer's shutdown and last buffered writes are not counted
        seconds = max(v.value for v in lasts) - t0
        failed = [proc.exitcode for proc in procs if proc.exitcode != 0]
        remaining = left(a.dsn, a.schema)
        if failed or remaining:
            raise SystemExit(f"{a.peer}: workers exited {failed}, {remaining} jobs left")
        print(json.dumps({"jobs": a.jobs, "seconds": seconds, "jobs_per_second": a.jobs / seconds,
                          "seconds_to_exit": exited}))
    finally:
        _drop(a.dsn, a.schema)


if __name__ == "__main__":
    main()
