"""The lease contract and maintenance against a real PostgreSQL, through the App and the
store: late outcomes, cancellations that outlast an attempt, limits that ignore expired
leases, a reaper that never overflows, never waits on a lock and follows each task's
retry policy, bounded worker sessions, and retention on an index made for it."""

from __future__ import annotations

import json
import threading

import psycopg
import pytest
from psycopg import sql

import pgworker
from worker import q

pytestmark = pytest.mark.integration


def expire(conn, schema, job_id):
    q(conn, schema, "UPDATE {s}.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s "
                    "RETURNING id", job_id)


def job(conn, schema, job_id):
    return q(conn, schema, "SELECT state::text, attempts, last_error_code, extract(epoch FROM run_at - now()) "
                           "FROM {s}.jobs WHERE id = %s", job_id)[0]


# -- late outcomes --------------------------------------------------------------------------


def test_a_late_success_is_accepted_while_the_row_is_still_ours(app, conn):
    """The lease expired but nobody reaped the job: the token proves ownership."""
    schema = app.settings.schema
    job_id = app.enqueue("t")
    [claimed] = app.claim()
    expire(conn, schema, job_id)
    app.complete(claimed)  # no LeaseLost
    assert job(conn, schema, job_id)[:2] == ("succeeded", 1)


def test_an_expired_lease_is_never_renewed_but_its_failure_is_recorded(app, conn):
    schema = app.settings.schema
    job_id = app.enqueue("t", max_attempts=3)
    [claimed] = app.claim()
    expire(conn, schema, job_id)
    with pytest.raises(pgworker.LeaseLost):
        app.renew(claimed)
    assert app.fail(claimed, RuntimeError("late")) == "pending"


# -- cancellations --------------------------------------------------------------------------


@pytest.mark.parametrize("ending", ["fail", "snooze", "release", "fail_last"])
def test_a_cancel_requested_while_running_ends_the_job_cancelled_whatever_the_attempt_did(app, conn, ending):
    schema = app.settings.schema
    job_id = app.enqueue("t", max_attempts=1 if ending == "fail_last" else 3)
    [claimed] = app.claim()
    assert app.cancel(job_id) == "running"
    with app.connection() as c:
        if ending.startswith("fail"):
            assert app.fail(claimed, RuntimeError("after the request")) == "cancelled"
        elif ending == "snooze":
            assert app.store.snooze(c, [claimed.lease], [5.0]).details[job_id] == "cancelled"
        else:
            app.release(claimed)
    state, _, code, _ = job(conn, schema, job_id)
    assert (state, code) == ("cancelled", "CANCELLED")
    assert app.claim() == []  # never claimed (and run) again


def test_a_cancelled_job_frees_its_ordering_key(app, conn):
    first = app.enqueue("t", ordering_key="k")
    second = app.enqueue("t", ordering_key="k")
    [claimed] = app.claim()
    assert claimed.id == first
    app.cancel(first)
    app.fail(claimed, RuntimeError("x"))
    assert [j.id for j in app.claim()] == [second]


# -- limits -----------------------------------------------------------------------------------


def test_a_global_concurrency_limit_counts_only_unexpired_leases(app, conn):
    schema = app.settings.schema
    app.configure_queue("default", concurrency_limit=2)
    app.enqueue_many([("t", i) for i in range(4)])
    first = app.claim(limit=4)
    assert len(first) == 2 and app.claim() == []
    for j in first:  # their pod died: nothing runs, though the rows still say running
        expire(conn, schema, j.id)
    assert len(app.claim(limit=4)) == 2


# -- the reaper -------------------------------------------------------------------------------


def test_the_reaper_never_overflows_on_a_job_with_many_attempts(app, conn):
    """A job at 1,100 attempts beside an ordinary expired one: both are recovered (the
    delay is clamped before any exponentiation)."""
    schema = app.settings.schema
    many = app.enqueue("t", max_attempts=1_000_000)
    plain = app.enqueue("t")
    app.claim(limit=2)
    q(conn, schema, "UPDATE {s}.jobs SET attempts = 1100 WHERE id = %s RETURNING id", many)
    expire(conn, schema, many)
    expire(conn, schema, plain)
    result = app.reap()
    assert set(result.requeued) == {many, plain}
    assert 0 < job(conn, schema, many)[3] <= 3600  # the default policy's cap


def test_the_reaper_retries_on_the_tasks_own_policy(app, conn):
    schema = app.settings.schema

    @app.task(name="patient", retry=pgworker.RetryPolicy(base_seconds=900, factor=1, max_seconds=900, jitter=0))
    def patient(payload):
        return None

    job_id = app.enqueue("patient")
    app.claim()
    expire(conn, schema, job_id)
    assert app.reap().requeued == (job_id,)
    assert 890 < job(conn, schema, job_id)[3] <= 900


def test_the_reaper_skips_an_ordering_key_locked_by_an_open_transaction(app, conn, pg_dsn):
    """A caller's transaction enqueued for key K and has not committed; K's running job
    expired. The reaper recovers the rest at once and leaves K's job for later."""
    schema = app.settings.schema
    keyed = app.enqueue("t", ordering_key="K")
    plain = app.enqueue("t")
    app.claim(limit=2)
    expire(conn, schema, keyed)
    expire(conn, schema, plain)
    with psycopg.connect(pg_dsn) as caller:  # not autocommit: the transaction stays open
        app.enqueue("t", ordering_key="K", conn=caller)
        out: dict = {}
        t = threading.Thread(target=lambda: out.setdefault("r", app.reap()), daemon=True)
        t.start()
        t.join(10)
        assert not t.is_alive(), "the reaper waited for the caller's lock"
        assert out["r"].requeued == (plain,) and out["r"].skipped == 1
        caller.rollback()
    assert app.reap().requeued == (keyed,)


def expired_running(conn, schema, n, *, minutes_ago, queue="default", payload="1", keys=None):
    """``n`` running jobs whose lease expired ``minutes_ago`` (their worker is gone)."""
    keys = keys or [None] * n
    return [q(conn, schema, "INSERT INTO {s}.jobs (queue, task, payload, state, attempts, lease_token, lease_owner, "
                            "lease_expires_at, ordering_key) VALUES (%s, 't', %s::jsonb, 'running', 1, 1, 'gone', "
                            "now() - make_interval(mins => %s), %s) RETURNING id",
              queue, payload, minutes_ago, key)[0][0] for key in keys]


def ddl(conn, schema, statement):
    conn.execute(sql.SQL(statement).format(s=sql.Identifier(schema)))


def reaped_in_one_pass(app, **config):
    """One reaper pass as the service runs it (its own autocommit session), in a thread that
    must not wait for any lock."""
    from pgworker.worker.reaper import ReaperConfig, reap_pass

    out: dict = {}

    def run():
        with app.connection() as c:
            out["n"] = reap_pass(app.store, c, ReaperConfig(**config))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the reaper waited for a lock"
    return out["n"]


def test_rows_other_sessions_hold_locked_never_hide_reapable_leases(app, conn, pg_dsn):
    """The pass read a batch of expired leases without locking them, then jobs_reap skipped
    the locked ones: a batch filled by rows other sessions hold locked reaped nothing and
    ended the pass (seen: 0 of 250 reapable leases reaped behind 1,500 older locked rows,
    pass after pass). Real row locks, held by an open transaction."""
    schema = app.settings.schema
    locked = expired_running(conn, schema, 30, minutes_ago=10)
    free = expired_running(conn, schema, 12, minutes_ago=1)
    with psycopg.connect(pg_dsn) as holder:  # an operator's open transaction
        q(holder, schema, "SELECT id FROM {s}.jobs WHERE id = ANY(%s) FOR UPDATE", locked)
        assert reaped_in_one_pass(app, batch=10) == 12
        assert {r[0] for r in q(conn, schema, "SELECT id FROM {s}.jobs WHERE state = 'pending'")} == set(free)
        # App.reap (one batch) as well: the locked rows do not fill it
        more = expired_running(conn, schema, 3, minutes_ago=5)
        assert sorted(app.reap(limit=10).requeued) == more
        holder.rollback()
    assert reaped_in_one_pass(app, batch=10) == 30  # and once released, they are reaped too


def test_expired_leases_whose_key_is_locked_never_hide_the_rest_of_a_pass(app, conn, pg_dsn):
    """Leases of ordering keys a caller's open transaction holds are skipped (maintenance
    never waits for a key); a batch full of them once ended the pass with nothing reaped."""
    schema = app.settings.schema
    keyed = expired_running(conn, schema, 15, minutes_ago=10, keys=[f"K{i}" for i in range(15)])
    free = expired_running(conn, schema, 5, minutes_ago=1)
    with psycopg.connect(pg_dsn) as caller:
        for i in range(15):  # enqueueing for a key holds its lock until the transaction ends
            app.enqueue("t", ordering_key=f"K{i}", conn=caller)
        assert reaped_in_one_pass(app, batch=10) == 5
        assert {r[0] for r in q(conn, schema, "SELECT id FROM {s}.jobs WHERE state = 'pending'")} == set(free)
        caller.rollback()
    assert reaped_in_one_pass(app, batch=10) == 15 and len(keyed) == 15


def test_a_row_the_reaper_cannot_write_is_isolated_and_reported(app, conn, caplog):
    """One row whose update fails (here a CHECK constraint a user added) made the whole
    batch fail on every pass (seen: 0 of 499 reaped). It is isolated: the rest of its batch
    is reaped, the row is reported (an ERROR naming the job and the error, and a
    REAP_FAILED entry in its error history) and left alone for a while, not retried (and
    reported) on every pass."""
    import logging

    from pgworker.worker.reaper import ReaperConfig, reap_pass

    schema = app.settings.schema
    before = expired_running(conn, schema, 250, minutes_ago=3)
    [bad] = expired_running(conn, schema, 1, minutes_ago=2, payload='"poison"')
    after = expired_running(conn, schema, 249, minutes_ago=1)
    ddl(conn, schema, """ALTER TABLE {s}.jobs ADD CONSTRAINT users_own_rule
                         CHECK (state <> 'pending' OR payload <> '"poison"'::jsonb)""")
    caplog.set_level(logging.INFO, logger="pgworker.reaper")
    with app.connection() as c:
        assert reap_pass(app.store, c, ReaperConfig()) == 499
    pending = {r[0] for r in q(conn, schema, "SELECT id FROM {s}.jobs WHERE state = 'pending'")}
    assert pending == set(before) | set(after)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and f"job {bad} " in errors[0].getMessage()
    assert 'violates check constraint "users_own_rule"' in errors[0].getMessage()
    record = app.get_job(bad)
    assert (record["state"], record["last_error_code"]) == ("running", "REAP_FAILED")
    assert record["errors"][-1]["code"] == "REAP_FAILED"
    assert "users_own_rule" in record["errors"][-1]["message"] and "poison" not in record["errors"][-1]["message"]
    unreapable: dict = {}  # what the reaper service keeps across its passes
    with app.connection() as c:
        assert reap_pass(app.store, c, ReaperConfig(), unreapable=unreapable) == 0
    assert set(unreapable) == {bad}
    caplog.clear()
    with app.connection() as c:  # the next pass leaves it alone (and says nothing more)
        assert reap_pass(app.store, c, ReaperConfig(), unreapable=unreapable) == 0
    assert not [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(app.get_job(bad)["errors"]) == 2  # one entry per try, not per pass
    # once the rule is fixed and the row is due for another try, it is reaped
    ddl(conn, schema, "ALTER TABLE {s}.jobs DROP CONSTRAINT users_own_rule")
    unreapable[bad] -= 3600
    with app.connection() as c:
        assert reap_pass(app.store, c, ReaperConfig(), unreapable=unreapable) == 1
    assert app.get_job(bad)["state"] == "pending" and not unreapable


def test_a_row_no_update_may_touch_is_reported_without_its_history(app, conn, caplog):
    """A trigger refusing every update of a row: its error history cannot be written either;
    the log says so, and the rest of the batch is reaped (here, App.reap's single batch)."""

    schema = app.settings.schema
    good = expired_running(conn, schema, 3, minutes_ago=2)
    [frozen] = expired_running(conn, schema, 1, minutes_ago=3, payload='"frozen"')
    ddl(conn, schema, """CREATE FUNCTION {s}.users_freeze() RETURNS trigger LANGUAGE plpgsql AS $$
                         BEGIN RAISE EXCEPTION 'row % is frozen', OLD.id; END $$""")
    ddl(conn, schema, """CREATE TRIGGER users_freeze BEFORE UPDATE ON {s}.jobs FOR EACH ROW
                         WHEN (OLD.payload = '"frozen"'::jsonb) EXECUTE FUNCTION {s}.users_freeze()""")
    result = app.reap(limit=10)
    assert sorted(result.requeued) == good
    [failure] = result.failed
    assert (failure.job_id, failure.sqlstate, failure.noted) == (frozen, "P0001", False)
    assert f"row {frozen} is frozen" in failure.message
    assert app.get_job(frozen)["errors"] == []


def test_a_rule_refusing_every_row_is_reported_in_a_bounded_number_of_lines(app, conn, caplog):
    """A trigger refusing the reap of every row: each row is isolated and counted, the
    pass logs the first ones one by one and then how many more, not a line per row."""
    import logging

    from pgworker.worker.reaper import MAX_UNREAPABLE_LOGGED, ReaperConfig, reap_pass

    schema = app.settings.schema
    expired_running(conn, schema, MAX_UNREAPABLE_LOGGED + 15, minutes_ago=1)
    ddl(conn, schema, """CREATE FUNCTION {s}.users_freeze() RETURNS trigger LANGUAGE plpgsql AS $$
                         BEGIN RAISE EXCEPTION 'nothing may be reaped'; END $$""")
    ddl(conn, schema, "CREATE TRIGGER users_freeze BEFORE UPDATE ON {s}.jobs FOR EACH ROW "
                      "EXECUTE FUNCTION {s}.users_freeze()")
    caplog.set_level(logging.INFO, logger="pgworker.reaper")
    unreapable: dict = {}
    with app.connection() as c:
        assert reap_pass(app.store, c, ReaperConfig(batch=10), unreapable=unreapable) == 0
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(lines) == MAX_UNREAPABLE_LOGGED + 1 and "15 more expired lease(s)" in lines[-1]
    assert len(unreapable) == MAX_UNREAPABLE_LOGGED + 15


def test_every_worker_session_has_bounded_statement_and_lock_timeouts(app, pg_dsn, schema):
    from pgworker.worker.claimer.connection import ClaimerConnection
    from pgworker.worker.service import worker_connect

    settings = app.settings.replace(statement_timeout_seconds=7, lock_timeout_seconds=3)
    with worker_connect(settings)("pgworker:test") as conn:
        assert conn.execute("SHOW statement_timeout").fetchone()[0] == "7s"
        assert conn.execute("SHOW lock_timeout").fetchone()[0] == "3s"
    claimer = ClaimerConnection(settings, 0, lambda: False)
    assert claimer.ensure(block=False)
    try:
        assert claimer.conn.execute("SHOW statement_timeout").fetchone()[0] == "7s"
        assert claimer.conn.execute("SHOW lock_timeout").fetchone()[0] == "3s"
        assert int(claimer.conn.info.get_parameters().get("tcp_user_timeout", "1") or 1) > 0
    finally:
        claimer.close()


# -- retention --------------------------------------------------------------------------------


def _finish(conn, schema, state, n, age="2 days"):
    q(conn, schema, f"""INSERT INTO {{s}}.jobs (queue, task, payload, state, finished_at)
        SELECT 'default', 't', 'null', %s::text::{{s}}.job_state, now() - interval '{age}'
        FROM generate_series(1, %s) RETURNING id""", state, n)


def test_the_pruner_keeps_each_state_for_its_own_retention(app, conn):
    from pgworker.worker.pruner import Retention, prune_pass

    schema = app.settings.schema
    for state in ("succeeded", "cancelled", "dead"):
        _finish(conn, schema, state, 30)
        _finish(conn, schema, state, 5, age="1 minute")
    q(conn, schema, "INSERT INTO {s}.queue_events (queue, kind, at) VALUES ('default', 'paused', now() - "
                    "interval '200 days'), ('default', 'resumed', now()) RETURNING id")
    with app.connection() as c:
        counts = prune_pass(app.store, c, Retention(succeeded=86400, cancelled=3600, dead=None, queue_events=86400),
                            batch=7)
    assert counts == {"succeeded": 30, "cancelled": 30, "dead": 0, "queue_events": 1}
    left = dict(q(conn, schema, "SELECT state::text, count(*) FROM {s}.jobs GROUP BY 1"))
    assert left == {"succeeded": 5, "cancelled": 5, "dead": 35}  # dead jobs kept: no retention set
    assert q(conn, schema, "SELECT kind FROM {s}.queue_events") == [("resumed",)]


def _plan(conn, statement, params):
    return conn.execute("EXPLAIN (FORMAT JSON) " + statement, params).fetchone()[0][0]["Plan"]


def _nodes(plan):
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def test_a_prune_batch_reads_its_own_rows_on_jobs_finished_idx(app, conn):
    schema = app.settings.schema
    _finish(conn, schema, "succeeded", 50_000)
    _finish(conn, schema, "dead", 20_000)
    q(conn, schema, "INSERT INTO {s}.jobs (queue, task, payload) SELECT 'default', 't', '{{}}' "
                    "FROM generate_series(1, 20000) RETURNING 1")
    conn.execute(sql.SQL("ANALYZE {}.jobs").format(sql.Identifier(schema)))
    statement = app.store.queries["jobs_prune"]
    params = {"succeeded_seconds": 86400, "cancelled_seconds": 86400, "dead_seconds": 86400, "limit": 1000,
              "namespace": "pgworker:x:ordering"}
    nodes = list(_nodes(_plan(conn, statement, params)))
    scans = [(n["Node Type"], n.get("Index Name")) for n in nodes if n.get("Relation Name") == "jobs"]
    assert not [s for s in scans if s[0] == "Seq Scan"], json.dumps(scans)
    assert {"jobs_finished_idx"} <= {name for _, name in scans}
    ev = list(_nodes(_plan(conn, app.store.queries["queue_events_prune"], {"older_than_seconds": 60, "limit": 10})))
    assert "queue_events_at_idx" in {n.get("Index Name") for n in ev}


def test_pgworker_prune_by_hand_still_deletes_old_finished_jobs(app, conn):
    schema = app.settings.schema
    _finish(conn, schema, "succeeded", 12)
    _finish(conn, schema, "dead", 3)
    assert app.prune(86400, batch=5) == 12
    assert dict(q(conn, schema, "SELECT state::text, count(*) FROM {s}.jobs GROUP BY 1")) == {"dead": 3}


def test_delays_are_bounded_before_they_reach_a_statement(app, conn):
    schema = app.settings.schema
    job_id = app.enqueue("t", max_attempts=3)
    [claimed] = app.claim()
    with app.connection() as c:
        report = app.store.snooze(c, [claimed.lease], [float("inf")])
    assert report.details[job_id] == "pending"
    assert job(conn, schema, job_id)[3] > 86400 * 365 * 50  # 'interval out of range' never reached it


# -- the pod's renewal never waits on a row (issue 18, item 1) ------------------------------


def test_the_pods_renewal_skips_a_row_another_session_holds_locked(app, pg_dsn, conn):
    """A row locked by an operator's open transaction is skipped (neither renewed nor
    refused: not a lost lease); the others are renewed, an expired one is refused."""
    schema = app.settings.schema
    for _ in range(3):
        app.enqueue("t")
    locked, free, gone = sorted(app.claim(limit=3), key=lambda j: j.id)
    expire(conn, schema, gone.id)
    with psycopg.connect(pg_dsn) as operator, \
            psycopg.connect(pg_dsn, autocommit=True, options="-c lock_timeout=30s") as renewer:
        q(operator, schema, "SELECT 1 FROM {s}.jobs WHERE id = %s FOR UPDATE", locked.id)
        report = app.store.renew_skip_locked(renewer, [j.lease for j in (locked, free, gone)], lease_seconds=60)
        operator.rollback()
        assert report.accepted == (free.id,)
        assert report.skipped == (locked.id,)
        assert report.refused == (gone.id,)
        assert report.details[free.id][0] is False  # no cancellation requested
        again = app.store.renew_skip_locked(renewer, [locked.lease], lease_seconds=60)
        assert again.accepted == (locked.id,) and not again.skipped


def test_a_take_over_is_refused_once_the_lease_has_expired(app, conn):
    """Issue 18, item 16 (a): a peer of the pod never takes over (and starts) a job whose
    lease has expired, even while the reaper has not moved it yet."""
    schema = app.settings.schema
    app.enqueue("t")
    [claimed] = app.claim(owner="pod:c0")
    with app.connection() as c:
        assert app.store.take_over(c, claimed.lease, owner="pod:c1") is not None
        expire(conn, schema, claimed.id)
        assert app.store.take_over(c, claimed.lease, owner="pod:c2") is None
    assert q(conn, schema, "SELECT lease_owner FROM {s}.jobs WHERE id = %s", claimed.id)[0][0] == "pod:c1"
