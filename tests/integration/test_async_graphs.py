"""Async dependencies and results (issue 21): ``aenqueue(depends_on=...)``,
``aenqueue_many`` with JobSpec refs, ``aresult`` and ``await_result`` against a real
PostgreSQL (and a real worker), through the same statement plans as the sync calls."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest
from psycopg import sql

from pgworker import InvalidJob, JobDidNotSucceed, JobNotFound, JobSpec, Permanent, ResultNotReady, ResultTimeout
from worker import Worker

pytestmark = pytest.mark.integration


def rows(conn, schema, ids):
    return {r[0]: r[1:] for r in conn.execute(sql.SQL(
        "SELECT id, state::text, waiting_parents, graph_id FROM {}.jobs WHERE id = ANY(%s)").format(
        sql.Identifier(schema)), (list(ids),)).fetchall()}


def edges(conn, schema):
    return sorted(conn.execute(sql.SQL("SELECT parent_id, child_id FROM {}.job_dependencies").format(
        sql.Identifier(schema))).fetchall())


def test_async_graphs_run_by_a_real_worker_and_awaited(env, pg_dsn, conn):
    """A fan-in built with aenqueue_many (refs) and a child added with aenqueue(depends_on)
    inside the caller's transaction: the same rows and edges as the sync calls make; a
    real worker runs them in order, and await_result (woken by NOTIFY) returns the sink's
    result."""
    schema = env.settings.schema

    async def build():
        async with await psycopg.AsyncConnection.connect(pg_dsn) as tx:
            ids = await env.aenqueue_many([JobSpec("sturdy", {"seconds": 0.1}, ref="a"),
                                           JobSpec("sturdy", {"seconds": 0.1}, ref="b"),
                                           JobSpec("sink", None, depends_on=["a", "b"], ref="s")], conn=tx)
            late = await env.aenqueue("returns", {"after": ids[2]}, depends_on=[ids[2]], conn=tx)
            await tx.commit()
        await env.aclose()
        return ids, late

    (a, b, s), late = asyncio.run(build())
    assert rows(conn, schema, [a, b, s, late]) == {a: ("pending", 0, a), b: ("pending", 0, a),
                                                   s: ("pending", 2, a), late: ("pending", 1, a)}
    assert edges(conn, schema) == sorted([(a, s), (b, s), (s, late)])

    async def wait():
        try:
            return await asyncio.gather(env.await_result(s, timeout=60, poll_seconds=30),
                                        env.await_result(late, timeout=60, poll_seconds=30))
        finally:
            await env.aclose()

    with Worker(pg_dsn, schema, "--concurrency", "2"):
        t0 = time.monotonic()
        got = asyncio.run(wait())
        elapsed = time.monotonic() - t0
    # woken by the completions' NOTIFY, not by the 30 s poll
    assert got == [2, {"echo": {"after": s}, "attempt": 1}] and elapsed < 25
    assert asyncio.run(env.aresult(s)) == 2


def test_async_dependency_errors_match_the_sync_ones_and_enqueue_nothing(app, pg_dsn, conn):
    schema = app.settings.schema
    parent = app.enqueue("t", None)

    async def main():
        with pytest.raises(InvalidJob, match="do not exist in schema"):
            await app.aenqueue("t", None, depends_on=[987654321])
        with pytest.raises(InvalidJob, match="names no earlier job of the same call"):
            await app.aenqueue_many([JobSpec("t", 1, depends_on=["nope"])])
        with pytest.raises(InvalidJob, match="graph_id names no graph"):
            await app.aenqueue("t", None, depends_on=[parent], graph_id=987654321)
        with pytest.raises(InvalidJob, match="on_parent_failure must be"):
            await app.aenqueue("t", None, depends_on=[parent], on_parent_failure="maybe")
        # in the caller's transaction: a refused graph leaves the transaction usable
        async with await psycopg.AsyncConnection.connect(pg_dsn) as tx:
            with pytest.raises(InvalidJob):
                await app.aenqueue("t", None, depends_on=[987654321], conn=tx)
        child = await app.aenqueue("t", None, depends_on=[parent], on_parent_failure="cancel")
        await app.aclose()
        return child

    child = asyncio.run(main())
    assert rows(conn, schema, [child]) == {child: ("pending", 1, None)}
    assert edges(conn, schema) == [(parent, child)]
    assert conn.execute(sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(schema))).fetchone()[0] == 2


def test_aresult_and_await_result_outcomes(app):
    job_id = app.enqueue("t")

    async def main():
        try:
            with pytest.raises(ResultNotReady):
                await app.aresult(job_id)
            with pytest.raises(JobNotFound):
                await app.aresult(987654321)
            with pytest.raises(ResultTimeout):
                await app.await_result(job_id, timeout=0.2, poll_seconds=0.05)
            with pytest.raises(ValueError, match="timeout must be >= 0"):
                await app.await_result(job_id, timeout=-1)
            [job] = app.claim()
            threading.Timer(0.3, lambda: app.complete(job, result={"n": 7})).start()
            t0 = time.monotonic()
            assert await app.await_result(job_id, timeout=20, poll_seconds=15) == {"n": 7}
            assert time.monotonic() - t0 < 10  # the NOTIFY woke it, not the 15 s poll
            assert await app.aresult(job_id) == {"n": 7}
            assert await app.wait_result_async(job_id, timeout=1) == {"n": 7}
            other = app.enqueue("t")
            [job2] = app.claim()
            threading.Timer(0.3, lambda: app.fail(job2, Permanent("no"))).start()
            with pytest.raises(JobDidNotSucceed) as info:  # a failure sends no NOTIFY: the poll sees it
                await app.await_result(other, timeout=20, poll_seconds=0.1)
            assert info.value.state == "dead"
        finally:
            await app.aclose()

    asyncio.run(main())


def test_await_result_does_not_block_the_event_loop(app):
    job_id = app.enqueue("t")

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.create_task(ticker())
        with pytest.raises(ResultTimeout):
            await app.await_result(job_id, timeout=0.5, poll_seconds=0.5)
        t.cancel()
        return ticks

    assert asyncio.run(main()) >= 20
