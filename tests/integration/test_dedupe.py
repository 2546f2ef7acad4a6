"""Deduplication backed by the unique index: the states that hold a key, holds that outlive
success, and producers racing on one key (threads and processes)."""

from __future__ import annotations

import multiprocessing
import threading

import psycopg
import pytest

from pgworker import App, InvalidJob, JobSpec, Permanent
from worker import q

pytestmark = pytest.mark.integration


def expire_holds(conn, schema):
    q(conn, schema, "UPDATE {s}.jobs SET dedupe_until = now() - interval '1 second' "
                    "WHERE dedupe_until IS NOT NULL RETURNING id")


def test_which_states_hold_a_key(app):
    first = app.enqueue("t", 1, dedupe_key="k")
    assert app.enqueue("t", 2, dedupe_key="k") == first  # pending
    [job] = app.claim()
    assert app.enqueue("t", 3, dedupe_key="k") == first  # running
    app.fail(job, RuntimeError("transient"))
    assert app.enqueue("t", 4, dedupe_key="k") == first  # waiting for its retry (pending)
    app.cancel(first)
    second = app.enqueue("t", 5, dedupe_key="k")  # cancelled: released
    assert second != first
    [job] = app.claim()
    app.fail(job, Permanent("no"))
    third = app.enqueue("t", 6, dedupe_key="k")  # dead: released
    assert third not in (first, second)
    [job] = app.claim()
    app.complete(job)
    assert app.enqueue("t", 7, dedupe_key="k") not in (first, second, third)  # succeeded: released


def test_a_window_keeps_the_key_after_success_then_releases_it(app, conn):
    schema = app.settings.schema
    first = app.enqueue("t", 1, dedupe_key="w", dedupe_window=3600)
    [job] = app.claim()
    app.complete(job)
    record = app.get_job(first)
    assert record["state"] == "succeeded" and record["dedupe_until"] is not None
    assert app.enqueue("t", 2, dedupe_key="w") == first  # held for an hour after success
    assert app.enqueue_many([JobSpec("t", 3, dedupe_key="w"), JobSpec("t", 4, dedupe_key="other")])[0] == first
    assert app.prune(0) == 0  # a row that holds its key is kept by prune
    expire_holds(conn, schema)
    second = app.enqueue("t", 5, dedupe_key="w")
    assert second != first
    assert app.get_job(first)["dedupe_until"] is None  # the expired hold was released
    assert app.prune(0) == 1  # and then the old row may go


def test_duplicates_in_enqueue_many_and_in_the_callers_transaction(app, pg_dsn):
    held = app.enqueue("t", "held", dedupe_key="h")
    with psycopg.connect(pg_dsn) as tx:
        ids = app.enqueue_many([JobSpec("t", i, dedupe_key=f"b{i % 2}") for i in range(4)]
                               + [JobSpec("t", "x", dedupe_key="h")], conn=tx)
        assert ids[0] == ids[2] and ids[1] == ids[3] and ids[4] == held
        assert app.enqueue("t", "again", dedupe_key="b0", conn=tx) == ids[0]
        tx.execute("SELECT 1")  # never aborted
        tx.commit()
    assert len(app.claim(limit=10)) == 3


def test_an_expired_hold_raced_by_many_producers_yields_one_job(app, pg_dsn, conn):
    schema = app.settings.schema
    first = app.enqueue("t", dedupe_key="r", dedupe_window=60)
    [job] = app.claim()
    app.complete(job)
    expire_holds(conn, schema)
    results: list[int] = []
    barrier = threading.Barrier(8)

    def producer():
        with psycopg.connect(pg_dsn) as tx:
            barrier.wait()
            results.append(app.enqueue("t", None, dedupe_key="r", dedupe_window=60, conn=tx))
            tx.commit()

    threads = [threading.Thread(target=producer) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(set(results)) == 1 and results[0] != first
    assert q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE dedupe_key = 'r' AND state = 'pending'") == [(1,)]


def _race_process(dsn, schema, key, many, barrier, out):
    app = App(dsn, schema=schema)
    barrier.wait()
    try:
        if many:
            out.put(app.enqueue_many([JobSpec("t", i, dedupe_key=key) for i in range(3)]))
        else:
            out.put([app.enqueue("t", None, dedupe_key=key)])
    finally:
        app.close()


def test_producer_processes_racing_on_one_key(app, pg_dsn, conn):
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(6), ctx.Queue()
    procs = [ctx.Process(target=_race_process, args=(pg_dsn, app.settings.schema, "proc-race", i % 2 == 0,
                                                     barrier, out)) for i in range(6)]
    [p.start() for p in procs]
    ids = [i for _ in procs for i in out.get(timeout=60)]
    [p.join(60) for p in procs]
    assert all(p.exitcode == 0 for p in procs)
    assert len(set(ids)) == 1
    assert q(conn, app.settings.schema, "SELECT count(*) FROM {s}.jobs") == [(1,)]


def test_replay_leaves_a_job_dead_when_its_key_is_held_again(app):
    dead = app.enqueue("t", dedupe_key="rp")
    [job] = app.claim()
    app.fail(job, Permanent("x"))
    holder = app.enqueue("t", dedupe_key="rp")
    assert app.replay([dead]) == []
    assert app.get_job(dead)["state"] == "dead"
    [job] = app.claim()
    assert job.id == holder
    app.complete(job)
    assert app.replay([dead]) == [dead]


def test_replay_says_which_job_holds_the_key_of_a_job_left_dead(app):
    """The caller tells "not dead / unknown" from "dedupe key held by job N" (before, both
    were only missing from the list), and the result is still the list of replayed ids."""
    dead = app.enqueue("t", dedupe_key="rp")
    [job] = app.claim()
    app.fail(job, Permanent("x"))
    holder = app.enqueue("t", dedupe_key="rp")
    pending = app.enqueue("t")
    result = app.replay([dead, pending, 424242])
    assert result == [] and result.held_by == {dead: holder} and result.not_dead == [pending, 424242]
    # two dead jobs of one key: the older comes back, the younger is held by it
    [job] = app.claim()
    assert job.id == holder
    app.fail(job, Permanent("x"))
    both = app.replay([holder, dead])
    assert both == [dead] and both.held_by == {holder: dead} and both.not_dead == []
    assert isinstance(both, list) and list(both) == [dead]
    # by queue, the same
    assert app.replay(queue="default").held_by == {holder: dead}


def test_a_window_without_a_key_is_refused(app):
    with pytest.raises(InvalidJob, match="dedupe_key"):
        app.enqueue("t", dedupe_window=60)


def test_a_queues_replay_passes_over_dead_jobs_whose_key_is_held_and_reaches_the_rest(app):
    """The lowest-id dead jobs of a queue, their dedupe keys held by live jobs, filled the
    limit at every call: 'call again for the rest' (limit_reached) never reached the
    rest (a break-it trial). They are passed over now, and named in held_by."""
    held = [app.enqueue("t", i, dedupe_key=f"hk{i}") for i in range(2)]
    rest = app.enqueue_many([("t", i) for i in range(3)])
    for job in app.claim(limit=5):
        app.fail(job, Permanent("x"))
    holders = [app.enqueue("t", dedupe_key=f"hk{i}", delay=3600) for i in range(2)]
    first = app.replay(queue="default", limit=2)
    assert (list(first), first.limit_reached) == (rest[:2], True)
    assert first.held_by == dict(zip(held, holders))
    second = app.replay(queue="default", limit=2)
    assert (list(second), second.limit_reached, second.held_by) == ([rest[2]], False, dict(zip(held, holders)))
    third = app.replay(queue="default", limit=2)
    assert (list(third), third.limit_reached) == ([], False) and third.held_by == dict(zip(held, holders))
    assert [app.get_job(i)["state"] for i in held + rest] == ["dead"] * 2 + ["pending"] * 3
    exactly = app.replay(queue="default", limit=2)  # no more than the limit left: not reached
    assert not exactly.limit_reached


@pytest.mark.parametrize("limit, error", [(0, ValueError), (-1, ValueError), (10**20, ValueError),
                                          (True, TypeError), (2.5, TypeError), ("10", TypeError)])
def test_a_replay_limit_out_of_range_is_refused_before_the_database(app, limit, error):
    with pytest.raises(error, match="limit"):
        app.replay(queue="default", limit=limit)
