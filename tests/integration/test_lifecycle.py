"""Every transition of the job state machine, and every fence, against real PostgreSQL."""

from __future__ import annotations

import threading

import psycopg
import pytest
from psycopg import sql

from pgworker import LeaseLost, Permanent
from pgworker.jobs import Lease
from pgworker import RetryPolicy

pytestmark = pytest.mark.integration
NO_BACKOFF = RetryPolicy(base_seconds=0, max_seconds=0, jitter=0)


def expire(conn, schema, job_id):
    """Let the lease run out (database clock) without sleeping."""
    conn.execute(sql.SQL("UPDATE {}.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s")
                 .format(sql.Identifier(schema)), [job_id])


def row(conn, schema, job_id):
    return conn.execute(sql.SQL("SELECT state::text, attempts, lease_token, run_at <= now(), last_error_code,"
                                " jsonb_array_length(errors) FROM {}.jobs WHERE id = %s")
                        .format(sql.Identifier(schema)), [job_id]).fetchone()


def test_claim_leases_with_a_growing_token(app, conn):
    job_id = app.enqueue("t", {"n": 1})
    [job] = app.claim(lease_seconds=30)
    assert (job.id, job.attempt, job.lease_token, job.payload) == (job_id, 1, 1, {"n": 1})
    assert job.lease_expires_at is not None
    assert app.claim() == []  # nothing else due
    assert row(conn, app.settings.schema, job_id)[:3] == ("running", 1, 1)


def test_complete_is_fenced(app, conn):
    app.enqueue("t")
    [job] = app.claim()
    app.complete(job)
    assert row(conn, app.settings.schema, job.id)[0] == "succeeded"
    with pytest.raises(LeaseLost) as info:
        app.complete(job)  # second completion: state is no longer running
    assert info.value.operation == "complete" and info.value.job_id == job.id


def test_stale_completion_renewal_failure_and_release_are_all_refused(app, conn):
    schema = app.settings.schema
    app.enqueue("t")
    [old] = app.claim()
    expire(conn, schema, old.id)
    assert app.reap(retry=NO_BACKOFF).requeued == (old.id,)
    [new] = app.claim()
    assert new.id == old.id and new.lease_token == old.lease_token + 1
    for op in (app.complete, app.renew, app.release):
        with pytest.raises(LeaseLost):
            op(old)
    with pytest.raises(LeaseLost):
        app.fail(old, RuntimeError("late"))
    report = app.store.complete(conn, [old.lease, new.lease])
    assert report.accepted == (new.id,) and report.refused == (old.id,)  # same job, two tokens
    assert row(conn, schema, new.id)[:3] == ("succeeded", 2, 2)


def test_batched_fence_reports_exactly_the_refused_rows(app, conn):
    schema = app.settings.schema
    app.enqueue_many([("t", i) for i in range(4)])
    jobs = app.claim(limit=4)
    expire(conn, schema, jobs[1].id)  # its lease expires, the reaper moves it, another claim takes it:
    assert app.reap(retry=NO_BACKOFF).requeued == (jobs[1].id,)  # (an expired lease alone no longer
    assert [j.id for j in app.claim()] == [jobs[1].id]  # refuses an outcome: the token proves ownership)
    forged = Lease(jobs[2].id, jobs[2].lease_token + 7)
    report = app.store.complete(conn, [jobs[0].lease, jobs[1].lease, forged, jobs[3].lease])
    assert set(report.accepted) == {jobs[0].id, jobs[3].id}
    assert set(report.refused) == {jobs[1].id, jobs[2].id}
    assert row(conn, schema, jobs[2].id)[0] == "running"


def test_renew_extends_the_lease_and_refuses_an_expired_one(app, conn):
    schema = app.settings.schema
    app.enqueue("t")
    [job] = app.claim(lease_seconds=5)
    assert app.renew(job, lease_seconds=120) is False
    left = conn.execute(sql.SQL("SELECT extract(epoch FROM lease_expires_at - now()) FROM {}.jobs WHERE id=%s")
                        .format(sql.Identifier(schema)), [job.id]).fetchone()[0]
    assert 100 < left <= 120
    expire(conn, schema, job.id)
    with pytest.raises(LeaseLost):
        app.renew(job)


def test_fail_retries_with_backoff_then_dies_with_history(app, conn):
    schema = app.settings.schema
    job_id = app.enqueue("t", max_attempts=2)
    [job] = app.claim()
    assert app.fail(job, RuntimeError("first")) == "pending"
    state, attempts, _, due, code, n_errors = row(conn, schema, job_id)
    assert (state, attempts, code, n_errors) == ("pending", 1, "RuntimeError", 1)
    assert not due  # scheduled after a backoff
    conn.execute(sql.SQL("UPDATE {}.jobs SET run_at = now() WHERE id = %s").format(sql.Identifier(schema)), [job_id])
    [job] = app.claim()
    assert app.fail(job, RuntimeError("second")) == "dead"
    record = app.get_job(job_id)
    assert record["state"] == "dead" and record["finished_at"] is not None
    assert [e["message"] for e in record["errors"]] == ["first", "second"]
    assert [e["attempt"] for e in record["errors"]] == [1, 2]


def test_permanent_failure_skips_retries(app):
    job_id = app.enqueue("t", max_attempts=10)
    [job] = app.claim()
    assert app.fail(job, Permanent("bad input")) == "dead"
    assert app.get_job(job_id)["last_error_code"] == "PERMANENT"


def test_error_history_is_bounded(app, conn):
    schema = app.settings.schema
    job_id = app.enqueue("t", max_attempts=50)
    for i in range(15):
        conn.execute(sql.SQL("UPDATE {}.jobs SET run_at = now() WHERE id = %s").format(sql.Identifier(schema)), [job_id])
        [job] = app.claim()
        app.fail(job, RuntimeError(f"e{i}" + "x" * 5000))
    errors = app.get_job(job_id)["errors"]
    assert len(errors) == app.settings.error_history_entries == 10
    assert errors[-1]["message"].startswith("e14") and errors[0]["message"].startswith("e5")
    assert all(len(e["message"]) <= app.settings.error_message_max_chars for e in errors)


def test_release_gives_the_attempt_back(app, conn):
    schema = app.settings.schema
    job_id = app.enqueue("t")
    [job] = app.claim()
    app.release(job)
    assert row(conn, schema, job_id)[:2] == ("pending", 0)
    [again] = app.claim()
    assert again.attempt == 1 and again.lease_token == 2


def test_reap_requeues_then_kills_with_lease_expired(app, conn):
    schema = app.settings.schema
    job_id = app.enqueue("t", max_attempts=2)
    for expected in ("pending", "dead"):
        conn.execute(sql.SQL("UPDATE {}.jobs SET run_at = now() WHERE id = %s").format(sql.Identifier(schema)), [job_id])
        [job] = app.claim()
        expire(conn, schema, job.id)
        result = app.reap(retry=NO_BACKOFF)
        assert result.total == 1
        assert row(conn, schema, job_id)[0] == expected
    record = app.get_job(job_id)
    assert record["last_error_code"] == "LEASE_EXPIRED" and len(record["errors"]) == 2


def test_concurrent_reapers_reap_each_job_once(app, pg_dsn):
    schema = app.settings.schema
    n = 2000
    app.enqueue_many([("t", i) for i in range(n)])
    app.claim(limit=n)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(sql.SQL("UPDATE {}.jobs SET lease_expires_at = now() - interval '1s'").format(sql.Identifier(schema)))
    results = []

    def reaper():
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            total = []
            while True:
                r = app.store.reap(c, limit=100, delay_for=lambda task, attempts: 0.0)
                if not r.total:
                    break
                total.extend(r.requeued)
            results.append(total)

    threads = [threading.Thread(target=reaper) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    reaped = [j for r in results for j in r]
    assert len(reaped) == n and len(set(reaped)) == n


def test_cancel_pending_running_and_dead(app, conn):
    a, b, c = app.enqueue("t"), app.enqueue("t"), app.enqueue("t", max_attempts=1)
    assert app.cancel(a) == "cancelled"
    [job_b, job_c] = sorted(app.claim(limit=2), key=lambda j: j.id)
    assert app.cancel(b) == "running"  # a request the renewal carries to the worker
    assert app.renew(job_b) is True
    app.fail(job_c, RuntimeError("x"))
    assert app.cancel(c) == "cancelled"  # discarding a dead job
    assert app.cancel(a) is None  # already finished
    events = app.get_job(b)["events"]
    assert events[0]["kind"] == "cancel_requested" and events[0]["actor"]
    assert app.store.finish_cancelled(conn, [job_b.lease]).ok
    assert app.get_job(b)["state"] == "cancelled"


def test_replay_keeps_id_history_and_audits(app, conn):
    job_id = app.enqueue("t", max_attempts=1)
    [job] = app.claim()
    conn.execute(sql.SQL("UPDATE {}.jobs SET progress = 0.5, progress_message = 'half', progress_at = now() "
                         "WHERE id = %s").format(sql.Identifier(app.settings.schema)), [job_id])
    app.fail(job, RuntimeError("broken"))
    assert app.replay([job_id], actor="ops@example") == [job_id]
    record = app.get_job(job_id)
    assert record["state"] == "pending" and record["attempts"] == 0
    # a fresh budget reads as never started (a trial: the dead attempt's clocks showed)
    assert [record.get(k) for k in ("started_at", "heartbeat_at", "progress", "progress_message", "progress_at")] \
        == [None] * 5, record
    assert record["errors"][0]["message"] == "broken"
    assert record["events"][-1]["kind"] == "replayed" and record["events"][-1]["actor"] == "ops@example"
    [again] = app.claim()
    assert again.id == job_id and again.lease_token == job.lease_token + 1
    # a full budget again, as README says: attempt 1 of the max_attempts it was enqueued with
    assert (again.attempt, again.max_attempts) == (1, 1)
    with pytest.raises(LeaseLost):
        app.complete(job)  # the stale owner of the dead attempt stays fenced out
    assert app.replay([job_id]) == []  # not dead any more


def test_replay_a_whole_queue(app):
    ids = app.enqueue_many([("t", i) for i in range(5)])
    for job in app.claim(limit=5):
        app.fail(job, Permanent("x"))
    assert sorted(app.replay(queue="default")) == sorted(ids)


def test_replay_by_id_takes_every_id_whatever_the_limit_of_a_queue(app):
    """``limit`` bounds the dead jobs of ``queue``: ids asked for by name were cut at it too
    (lowest first) and the rest reported ``not_dead``, which they were not."""
    ids = app.enqueue_many([("t", i) for i in range(3)])
    others = [app.enqueue("t", i, queue="other") for i in range(3)]
    for job in app.claim(limit=3) + app.claim("other", limit=3):
        app.fail(job, Permanent("x"))
    result = app.replay(ids, limit=2)
    assert (sorted(result), result.not_dead) == (ids, [])
    for job in app.claim(limit=3):
        app.fail(job, Permanent("x"))
    # ids and a queue: every id, and up to limit of the queue's
    both = app.replay(ids[1:], queue="other", limit=1)
    assert (sorted(both), both.not_dead) == (sorted(ids[1:] + others[:1]), [])


def test_prune_deletes_old_finished_jobs_in_batches(app, conn):
    schema = app.settings.schema
    app.enqueue_many([("t", i) for i in range(25)])
    keep = app.enqueue("t")
    for job in app.claim(limit=25):
        app.complete(job)
    conn.execute(sql.SQL("UPDATE {}.jobs SET finished_at = now() - interval '8 days' WHERE state = 'succeeded'")
                 .format(sql.Identifier(schema)))
    assert app.prune(7 * 86400, batch=10) == 25
    assert app.get_job(keep)["state"] == "pending"
