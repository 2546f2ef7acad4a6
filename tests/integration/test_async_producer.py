"""The asyncio producer API (pgworker.aio) against a real PostgreSQL: aenqueue and
aenqueue_many in the caller's AsyncConnection transaction and on the App's async pool,
their NOTIFY, validation, tracing and dedupe outcome; acancel, areplay, aget_job; and the
clear TypeError when a sync call is given an async connection or the reverse."""

from __future__ import annotations

import asyncio
import warnings

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from psycopg import sql

from pgworker import AlreadyEnqueued, App, DatabaseUnavailable, JobSpec, Permanent, UnknownTask, tracing
from pgworker.producer import COPY_MIN_JOBS
from pg import make_settings
from worker import Worker

pytestmark = pytest.mark.integration


def listen(pg_dsn, app):
    conn = psycopg.connect(pg_dsn, autocommit=True)
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(app.store.channel)))
    return conn


def notes(conn, wait=0.3, expect=None):
    return [n.payload for n in conn.notifies(timeout=wait, stop_after=expect)]


def count(conn, app):
    return conn.execute(sql.SQL("SELECT count(*) FROM {}.jobs").format(
        sql.Identifier(app.settings.schema))).fetchone()[0]


def run(coro):
    return asyncio.run(coro)


def test_aenqueue_in_the_callers_transaction_rollback_leaves_nothing_commit_wakes(app, pg_dsn, conn):
    listener = listen(pg_dsn, app)

    async def main():
        async with await psycopg.AsyncConnection.connect(pg_dsn) as tx:
            await app.aenqueue("t", {"order": 1}, conn=tx)
            await app.aenqueue_many([("t", 1), ("t", 2)], conn=tx)
            assert count(conn, app) == 0  # not visible before commit
            await tx.rollback()
        assert count(conn, app) == 0 and notes(listener) == []  # no job, no wake-up
        async with await psycopg.AsyncConnection.connect(pg_dsn) as tx:
            job_id = await app.aenqueue("t", {"order": 2}, conn=tx)
            assert notes(listener) == []  # NOTIFY waits for the commit
            await tx.commit()
        return job_id

    job_id = run(main())
    assert notes(listener, 5, expect=1) == ["default"]
    assert app.get_job(job_id)["payload"] == {"order": 2}
    listener.close()


def test_aenqueue_on_the_apps_async_pool_commits_at_once_and_aclose_closes_it(app, pg_dsn, conn):
    listener = listen(pg_dsn, app)

    async def main():
        ids = await asyncio.gather(*(app.aenqueue("t", i, queue="q1") for i in range(10)))
        pool = app._apool
        assert pool is not None and not pool.closed
        await app.aclose()
        assert pool.closed and app._apool is None
        await app.aclose()  # twice is fine
        return ids

    ids = run(main())
    assert len(set(ids)) == 10 and count(conn, app) == 10
    assert set(notes(listener, 5, expect=1)) == {"q1"}
    # a second event loop (asyncio.run again) opens a new pool rather than reusing the old one's
    assert run(app.aenqueue("t", 11)) > max(ids)
    run(app.aclose())
    listener.close()


def test_a_committed_async_enqueue_is_run_by_a_real_worker(env, pg_dsn, conn):
    schema = env.settings.schema

    async def main():
        async with await psycopg.AsyncConnection.connect(pg_dsn) as tx:
            ids = [await env.aenqueue("noop", None, conn=tx)]
            ids += await env.aenqueue_many([JobSpec("noop", i) for i in range(3)], conn=tx)
            await tx.commit()
        await env.aclose()
        return ids

    ids = run(main())
    ids.append(run(env.aenqueue(env.tasks["noop"], None)))  # a Task object, on the async pool
    run(env.aclose())
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "2") as w:
        assert w.wait(60) == 0, w.logs()[-3000:]
    states = {job_id: env.get_job(job_id)["state"] for job_id in ids}
    assert set(states.values()) == {"succeeded"}, states


def test_aenqueue_many_copy_path_in_a_transaction(app, pg_dsn, conn):
    n = COPY_MIN_JOBS + 5
    listener = listen(pg_dsn, app)

    async def main():
        async with await psycopg.AsyncConnection.connect(pg_dsn) as tx:
            await app.aenqueue_many([("t", i) for i in range(n)], conn=tx)
            await tx.rollback()
        assert count(conn, app) == 0
        async with await psycopg.AsyncConnection.connect(pg_dsn) as tx:
            ids = await app.aenqueue_many([JobSpec("t", {"i": i}, queue="bulk") for i in range(n)], conn=tx)
            await tx.commit()
        return ids

    ids = run(main())
    assert len(ids) == n and ids == sorted(ids)
    assert count(conn, app) == n
    assert notes(listener, 5, expect=1) == ["bulk"]
    assert app.get_job(ids[-1])["payload"] == {"i": n - 1}
    listener.close()


def test_async_dedupe_returns_the_holder_or_raises_and_keeps_the_transaction(app, pg_dsn, conn):
    async def main():
        held = await app.aenqueue("t", 1, dedupe_key="k")
        assert await app.aenqueue("t", 2, dedupe_key="k") == held
        with pytest.raises(AlreadyEnqueued) as single:
            await app.aenqueue("t", 3, dedupe_key="k", on_conflict="raise")
        assert single.value.job_id == held and single.value.dedupe_key == "k"
        async with await psycopg.AsyncConnection.connect(pg_dsn) as tx:
            mine = await app.aenqueue("t", "mine", conn=tx)
            with pytest.raises(AlreadyEnqueued) as batch:
                await app.aenqueue_many([JobSpec("t", 4, dedupe_key="new"), JobSpec("t", 5, dedupe_key="k")],
                                        conn=tx, on_conflict="raise")
            assert batch.value.held_by == {1: held}
            # the batch was undone by its savepoint; the caller's transaction goes on
            again = await app.aenqueue_many([JobSpec("t", 4, dedupe_key="new"), JobSpec("t", 5, dedupe_key="k")],
                                            conn=tx)
            await tx.commit()
        return held, mine, again

    held, mine, again = run(main())
    assert again[1] == held and again[0] not in (held, mine)
    assert count(conn, app) == 3  # held, mine, and the one 'new' job


def test_validation_happens_before_any_connection(pg_dsn, schema):
    app = App(settings=make_settings("host=127.0.0.1 port=1 user=nobody dbname=none connect_timeout=1", schema))

    @app.task(name="known")
    def known(payload):
        return None

    async def main():
        with pytest.raises(UnknownTask, match="knwon"):
            await app.aenqueue("knwon")
        with pytest.raises(ValueError, match="priority"):
            await app.aenqueue_many([JobSpec("known", priority=10**6)])
        with pytest.raises(ValueError, match="on_conflict"):
            await app.aenqueue("known", on_conflict="ignore")
        assert app._apool is None
        with pytest.raises(DatabaseUnavailable, match="cannot connect"):
            await app.aenqueue("known")

    run(main())


def test_sync_and_async_calls_refuse_the_other_kind_of_connection(app, pg_dsn, conn):
    async def main():
        async with await psycopg.AsyncConnection.connect(pg_dsn) as aconn:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # no "coroutine was never awaited"
                with pytest.raises(TypeError, match=r"await app\.aenqueue\(\.\.\., conn=conn\)"):
                    app.enqueue("t", conn=aconn)
                with pytest.raises(TypeError, match=r"await app\.aenqueue_many"):
                    app.enqueue_many([("t", 1)], conn=aconn)
                with pytest.raises(TypeError, match=r"await app\.acancel"):
                    app.cancel(1, conn=aconn)
                with pytest.raises(TypeError, match="AsyncConnection"):
                    with app.connection(aconn):
                        pass
        with pytest.raises(TypeError, match=r"app\.enqueue\(\.\.\., conn=conn\) \(no await\)"):
            await app.aenqueue("t", conn=conn)
        with pytest.raises(TypeError, match=r"app\.enqueue_many"):
            await app.aenqueue_many([("t", 1)], conn=conn)
        with pytest.raises(TypeError, match=r"app\.cancel"):
            await app.acancel(1, conn=conn)

    run(main())
    assert count(conn, app) == 0


def test_acancel_areplay_and_aget_job(app, pg_dsn, conn):
    dead = app.enqueue("t", "will die", max_attempts=1)
    [job] = app.claim()
    app.fail(job, Permanent("boom"))
    pending = app.enqueue("t", "to cancel", ordering_key="o")
    behind = app.enqueue("t", "behind", ordering_key="o")

    async def main():
        record = await app.aget_job(dead)
        assert record["state"] == "dead" and record["payload"] == "will die"
        assert isinstance(record["events"], list) and record["last_error_code"]
        assert await app.aget_job(10**9) is None
        assert await app.acancel(pending, actor="tester") == "cancelled"
        assert await app.acancel(pending) is None  # already finished
        replayed = await app.areplay([dead, 10**9], actor="tester")
        assert list(replayed) == [dead] and replayed.not_dead == [10**9]
        async with await psycopg.AsyncConnection.connect(pg_dsn) as tx:
            assert (await app.aget_job(behind, conn=tx))["state"] == "pending"
        await app.aclose()

    run(main())
    assert app.get_job(pending)["state"] == "cancelled"
    kinds = [e["kind"] for e in app.get_job(pending)["events"]]
    assert "cancelled" in kinds
    assert app.get_job(dead)["state"] == "pending"
    # the cancel promoted the next job of the ordering key: it is claimable now
    claimed = [j.id for j in app.claim(limit=5)]
    assert behind in claimed


def test_async_enqueue_records_the_same_send_span(app, pg_dsn):
    exp = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exp))
    tracing.set_tracer_provider(provider)
    try:
        app.configure(app.settings.replace(tracing=True))
        request_tracer = trace.get_tracer("the application", tracer_provider=provider)

        async def main():
            with request_tracer.start_as_current_span("POST /orders") as request:
                job_id = await app.aenqueue("t", {"order": 1})
                await app.aenqueue_many([("t", 1), ("t", 2)])
                dup = await app.aenqueue("t", 2, dedupe_key="d")
                assert await app.aenqueue("t", 3, dedupe_key="d") == dup
            await app.aclose()
            return job_id, request

        job_id, request = run(main())
        sends = [s for s in exp.get_finished_spans() if s.name.startswith("send ")]
        assert len(sends) == 4, [s.name for s in exp.get_finished_spans()]
        assert all(s.context.trace_id == request.get_span_context().trace_id for s in sends)
        assert sends[0].attributes["messaging.message.id"] == str(job_id)
        assert sends[-1].attributes.get("pgworker.dedupe.duplicate") is True
        # the trace context went into the row, as the sync enqueue puts it
        assert app.get_job(job_id)["trace_context"]
    finally:
        tracing.set_tracer_provider(None)
        provider.shutdown()


def test_sync_dedupe_on_conflict_raise(app, pg_dsn, conn):
    held = app.enqueue("t", 1, dedupe_key="k")
    with pytest.raises(AlreadyEnqueued) as err:
        app.enqueue("t", 2, dedupe_key="k", on_conflict="raise")
    assert err.value.job_id == held and "held by job" in str(err.value)
    assert app.enqueue("t2", dedupe_key="k2") > held
    with psycopg.connect(pg_dsn) as tx:
        first = app.enqueue("t", "in tx", conn=tx)
        with pytest.raises(AlreadyEnqueued) as err:
            app.enqueue_many([JobSpec("t", 3, dedupe_key="fresh"), JobSpec("t", 4, dedupe_key="k"),
                              JobSpec("t", 5, dedupe_key="k")], conn=tx, on_conflict="raise")
        assert err.value.held_by == {1: held, 2: held}
        # nothing of the batch is left, and the transaction is still usable
        assert app.enqueue("t", "after", conn=tx) > first
        tx.commit()
    assert count(conn, app) == 4  # held, t2's, "in tx", "after"
    with pytest.raises(AlreadyEnqueued):  # own transaction: rolled back as a whole
        app.enqueue_many([JobSpec("t", 6, dedupe_key="fresh2"), JobSpec("t", 7, dedupe_key="k")],
                         on_conflict="raise")
    assert count(conn, app) == 4
    # the default is unchanged: the holder's id, as an int
    ids = app.enqueue_many([JobSpec("t", 6, dedupe_key="fresh2"), JobSpec("t", 7, dedupe_key="k")])
    assert ids[1] == held and type(ids[1]) is int


def test_task_aenqueue_uses_its_app_and_defaults(app, conn):
    @app.task(name="bound", queue="bq", priority=7)
    def bound(payload):
        return None

    async def main():
        job_id = await bound.aenqueue({"x": 1})
        await app.aclose()
        return job_id

    job = app.get_job(run(main()))
    assert (job["queue"], job["priority"], job["payload"]) == ("bq", 7, {"x": 1})


def test_configure_drops_the_async_pool_of_the_old_settings(app, pg_dsn, conn, schema):
    async def main():
        await app.aopen()
        old = app._apool
        app.configure(app.settings.replace(schema=schema))  # the same schema: a new Store, a new pool
        assert app._apool is None
        await asyncio.sleep(0.2)  # the old pool closes in this loop
        assert old.closed
        job_id = await app.aenqueue("t", 1)
        async with app:  # `async with` closes the async pool (and the sync one) at the end
            pass
        assert app._apool is None
        return job_id

    assert app.get_job(run(main()))["state"] == "pending"
