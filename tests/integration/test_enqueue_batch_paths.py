"""The bulk enqueue's three paths (one statement below COPY_MIN_JOBS, COPY from it, the
keyed insert) write what single enqueues of the same jobs write, with ids in input
order; the batch's encoding (pgworker.store.batch: payloads as one text, the options
jobs share sent once per "shape", COPY text written in one string) loses nothing."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from psycopg import sql

from pgworker import JobSpec
from pgworker.producer import COPY_MIN_JOBS, enqueue_batch

pytestmark = pytest.mark.integration

COLUMNS = ("queue", "task", "payload", "priority", "max_attempts", "state", "blocked", "trace_context",
           "dedupe_key", "ordering_key")

# payloads a COPY row or a joined text could mangle: backslashes (JSON escapes, and COPY's
# own escape character), escaped tabs, newlines and carriage returns, quotes, non-ASCII text
AWKWARD = [{"path": "C:\\temp\\new"}, "tab\there", "line\nbreak\r\n", 'quote " and \\"', "été ✓ 😀",
           {"nested": [1, "\\N", None, {"k": "\\\\"}]}, "\\", 0, None, [], {}]


def rows(conn, app, ids):
    cols = sql.SQL(", ").join(map(sql.Identifier, COLUMNS))
    got = {r[0]: r[1:] for r in conn.execute(sql.SQL("SELECT id, {} FROM {}.jobs WHERE id = ANY(%s)").format(
        cols, sql.Identifier(app.settings.schema)), [list(ids)])}
    return [got[i] for i in ids]


def offsets(conn, app, ids):
    """Each job's run_at minus its created_at, in whole seconds (its delay)."""
    got = dict(conn.execute(sql.SQL(
        "SELECT id, round(extract(epoch FROM run_at - created_at))::int FROM {}.jobs WHERE id = ANY(%s)").format(
        sql.Identifier(app.settings.schema)), [list(ids)]).fetchall())
    return [got[i] for i in ids]


def mixed_specs(n):
    """Jobs of several shapes, interleaved: queues, tasks, priorities, delays, attempts."""
    at = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=timezone.utc)
    out = []
    for i in range(n):
        k = i % 5
        out.append(JobSpec("t" if k < 3 else "u", AWKWARD[i % len(AWKWARD)], queue=("a", "b", "a", "c", "b")[k],
                           priority=(0, 3, -2, 0, 7)[k], delay=(None, 60, None, 3600, None)[k],
                           max_attempts=(None, 2, 9, None, 1)[k], run_at=at if k == 4 else None))
    return out


@pytest.mark.parametrize("n", [7, COPY_MIN_JOBS + 3], ids=["statement", "copy"])
def test_a_mixed_batch_writes_what_single_enqueues_write(app, conn, n):
    specs = mixed_specs(n)
    batch = app.enqueue_many(specs)
    single = [app.enqueue(s.task, s.payload, queue=s.queue, priority=s.priority, delay=s.delay,
                          max_attempts=s.max_attempts, run_at=s.run_at) for s in specs[:15]]
    assert len(set(batch)) == n and batch == sorted(batch)  # ids drawn in input order
    got = rows(conn, app, batch)
    assert [r[2] for r in got] == [s.payload for s in specs]  # each job its own payload
    assert got[:15] == rows(conn, app, single)
    assert offsets(conn, app, batch[:15])[:4] == offsets(conn, app, single)[:4] == [0, 60, 0, 3600]
    run_at = conn.execute(sql.SQL("SELECT run_at FROM {}.jobs WHERE id = %s").format(
        sql.Identifier(app.settings.schema)), [batch[4]]).fetchone()[0]
    assert run_at == specs[4].run_at


@pytest.mark.parametrize("n", [5, COPY_MIN_JOBS], ids=["statement", "copy"])
def test_a_batch_counts_its_jobs_per_queue_and_wakes_the_due_queues(app, conn, n):
    class Recorded:
        def __init__(self):
            self.calls = []

        def enqueued(self, queue, count):
            self.calls.append((queue, count))

    metrics = Recorded()
    specs = [JobSpec("t", i, queue=("a", "b", "later")[i % 3], delay=600 if i % 3 == 2 else None)
             for i in range(n)]
    prepared = app.core.prepared.many(specs)
    with app.core.connection() as c:
        c.execute(sql.SQL("LISTEN {}").format(sql.Identifier(app.store.channel)))
        ids = enqueue_batch(app.store, c, prepared, metrics)
        woken = sorted(note.payload for note in c.notifies(timeout=1, stop_after=2))
        c.execute("UNLISTEN *")
    assert len(ids) == n
    expected = {q: sum(1 for s in specs if s.queue == q) for q in ("a", "b", "later")}
    assert dict(metrics.calls) == expected and len(metrics.calls) == 3
    assert woken == ["a", "b"]  # the delayed queue's jobs are not due: no wake-up for it


def test_a_batch_mixing_keyed_deduped_and_plain_jobs(app, conn):
    """The keyed path: held keys return their holders, in-batch duplicates the first, the
    later jobs of an ordering key wait behind the first; plain jobs go in as they are."""
    held = app.enqueue("t", "held", dedupe_key="d-held")
    specs = [JobSpec("t", "plain-1"), JobSpec("t", "dup", dedupe_key="d-held"),
             JobSpec("t", "k1", ordering_key="k"), JobSpec("t", "new", dedupe_key="d-new"),
             JobSpec("t", "k2", ordering_key="k"), JobSpec("t", "again", dedupe_key="d-new"),
             JobSpec("u", "plain-2", queue="other", priority=4)]
    ids = app.enqueue_many(specs)
    assert ids[1] == held and ids[5] == ids[3]
    fresh = [ids[i] for i in (0, 2, 3, 4, 6)]
    assert len(set(fresh)) == 5 and held not in fresh and fresh == sorted(fresh)
    got = rows(conn, app, fresh)
    assert [(r[0], r[1], r[2], r[3], r[6], r[8], r[9]) for r in got] == [
        ("default", "t", "plain-1", 0, False, None, None),
        ("default", "t", "k1", 0, False, None, "k"),
        ("default", "t", "new", 0, False, "d-new", None),
        ("default", "t", "k2", 0, True, None, "k"),  # behind k1
        ("other", "u", "plain-2", 4, False, None, None)]
    # and the same jobs again: every dedupe key held now, the ordering key's jobs queue behind
    again = app.enqueue_many(specs)
    assert again[1] == held and again[3] == again[5] == ids[3]
    assert [r[6] for r in rows(conn, app, [again[2], again[4]])] == [True, True]


def test_a_batch_with_a_trace_context_stores_it_on_every_job(app, conn, monkeypatch):
    from pgworker import tracing

    monkeypatch.setattr(tracing, "carrier", lambda span: {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    for n in (3, COPY_MIN_JOBS):
        ids = app.enqueue_many([JobSpec("t", i, queue=("a", "b")[i % 2]) for i in range(n)])
        contexts = {r[7]["traceparent"] for r in rows(conn, app, ids)}
        assert contexts == {"00-" + "1" * 32 + "-" + "2" * 16 + "-01"}


def test_a_delay_batch_through_copy_takes_the_database_clock(app, conn):
    ids = app.enqueue_many([JobSpec("t", i, delay=timedelta(minutes=(i % 2) * 10)) for i in range(COPY_MIN_JOBS)])
    assert set(offsets(conn, app, ids)) == {0, 600}
